// The usage page (issue 46): the tenant's GPU time by UTC day over the last
// 7 or 30 days, read from GET /v1/usage?granularity=day (its exact
// GPU-seconds). Each day's bar is stacked productive (at the bottom), then
// lost by cause, in the job timeline's colours (timeline.js PARTS, style.css
// tl-<part>) so both pictures agree. Grouped by a label (label:<key>), the
// GPU type or the job: a chart of every group together (each day's total),
// then one per group on a scale they share. A legend, the totals as text
// (held, productive, goodput, lost by cause) and a table say the same. SVG
// whose geometry is attributes and whose colours are CSS classes: nothing
// inline, as the page's Content-Security-Policy asks.
import { api, ApiError } from './api.js';
import { h, setText, poll, problemText, clock, count } from './dom.js';
import { PARTS, fixed, amount, unitOf, usageSentence } from './timeline.js';

const SVG = 'http://www.w3.org/2000/svg';
const DAY_MS = 86400000;
/** the periods offered, in days (today, UTC, so far, and the days before) */
export const PERIODS = [7, 30];
/** what the page groups by when its address names nothing */
export const DEFAULT_BY = 'label:team';
const REFRESH_MS = 60000;
/** group charts drawn; the rest are summed into one */
const MAX_PANELS = 12;
const MAX_TABLE_ROWS = 2000;
const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
const UNIT_S = { 'GPU-h': 3600, 'GPU-min': 60, 'GPU-s': 1 };

/** The page's settings from its address: #/usage?days=30&by=label:team
 * (by empty: no grouping). */
export function settingsOf(hash) {
  const q = new URLSearchParams((hash || '').split('?')[1] || '');
  const days = Number(q.get('days'));
  const by = q.get('by');
  return { days: PERIODS.includes(days) ? days : PERIODS[0], by: by == null ? DEFAULT_BY : by };
}

export function addressOf({ days, by }) {
  return `#/usage?days=${days}&by=${encodeURIComponent(by)}`;
}

/** The UTC days (YYYY-MM-DD) of the last `days`, today last. */
export function dayKeys(now, days) {
  const today = Math.floor(now / DAY_MS) * DAY_MS;
  return Array.from({ length: days }, (_, i) => new Date(today - (days - 1 - i) * DAY_MS).toISOString().slice(0, 10));
}

/** "Dec 3": a day on the axis. */
export function dayShort(day) {
  return `${MONTHS[Number(day.slice(5, 7)) - 1]} ${Number(day.slice(8, 10))}`;
}

// -- the rows, summed ------------------------------------------------------------

const blank = () => ({ held: 0, productive: 0, lost: {} });

/** A row's exact GPU-seconds (the hours, ÷ 3600 to 6 decimals, when a server gives none). */
export function secondsOf(row) {
  const s = (sec, hours) => (sec != null ? Number(sec) : Math.round(Number(hours || 0) * 3600));
  const lost = row.lost_gpu_seconds
    || Object.fromEntries(Object.entries(row.lost_gpu_hours || {}).map(([k, v]) => [k, s(null, v)]));
  return { held: s(row.gpu_seconds, row.gpu_hours), productive: s(row.productive_gpu_seconds, row.productive_gpu_hours), lost };
}

function add(into, s) {
  into.held += s.held;
  into.productive += s.productive;
  for (const [k, v] of Object.entries(s.lost || {})) into.lost[k] = (into.lost[k] || 0) + Number(v);
  return into;
}

/** The value a row is grouped by: null for the jobs without the label, undefined ungrouped. */
const valueOf = (row) => Object.values(row.group || {})[0];

/** A group's name as a person reads it: "team=ml", "no team label", "h100", "any GPU type", a job's id. */
export function groupTitle(by, value) {
  if (by.startsWith('label:')) {
    const key = by.slice('label:'.length);
    return value == null ? `no ${key} label` : `${key}=${value}`;
  }
  if (by === 'gpu_type') return value == null || value === 'any' ? 'any GPU type' : String(value);
  return String(value);
}

/** The column's title for what the page groups by (cli.py _group_title). */
export function groupHead(by) {
  return { gpu_type: 'GPU type', job: 'Job' }[by] || by.slice('label:'.length) || by;
}

/**
 * The rows summed: the total, each day's (every one of `days`, none left
 * out), and each group's, each day's within it; the groups most GPU time
 * first (the jobs without the label last), past MAX_PANELS summed into one
 * ({others: n}).
 */
export function usageModel(rows, days, by) {
  const total = blank();
  const byDay = new Map(days.map((d) => [d, blank()]));
  const groups = new Map();
  for (const r of rows || []) {
    const day = String(r.start).slice(0, 10);
    const s = secondsOf(r);
    add(total, s);
    if (!byDay.has(day)) byDay.set(day, blank());
    add(byDay.get(day), s);
    if (!by) continue;
    const value = valueOf(r) ?? null;
    const key = value == null ? '' : `=${value}`;
    if (!groups.has(key)) groups.set(key, { value, title: groupTitle(by, value), total: blank(), byDay: new Map() });
    const g = groups.get(key);
    add(g.total, s);
    if (!g.byDay.has(day)) g.byDay.set(day, blank());
    add(g.byDay.get(day), s);
  }
  const allDays = [...byDay.keys()].sort();
  let list = [...groups.values()].sort((a, b) => (a.value == null) - (b.value == null)
    || b.total.held - a.total.held || (a.title < b.title ? -1 : a.title > b.title ? 1 : 0));
  if (list.length > MAX_PANELS) {
    const rest = list.slice(MAX_PANELS - 1);
    const title = by === 'job' ? count(rest.length, 'other job') : by === 'gpu_type' ? count(rest.length, 'other GPU type')
      : `${count(rest.length, 'other value')} of ${groupHead(by)}`;
    const other = { value: undefined, others: rest.length, title, total: blank(), byDay: new Map() };
    for (const g of rest) {
      add(other.total, g.total);
      for (const [d, s] of g.byDay) { if (!other.byDay.has(d)) other.byDay.set(d, blank()); add(other.byDay.get(d), s); }
    }
    list = list.slice(0, MAX_PANELS - 1).concat([other]);
  }
  return { days: allDays, total, byDay, groups: list };
}

// -- words -------------------------------------------------------------------------

/** The parts of a sum in the legend's order: productive, then the causes PARTS names, then any other. */
export function partsOf(s) {
  const out = [['productive', s.productive]];
  for (const p of Object.keys(PARTS)) if (p !== 'productive' && s.lost[p]) out.push([p, s.lost[p]]);
  for (const [p, v] of Object.entries(s.lost)) if (!PARTS[p] && v) out.push([p, v]);
  return out;
}

const partName = (p) => PARTS[p] || p.replace(/_/g, ' ');
const goodput = (s) => (s.held > 0 ? `${fixed((100 * s.productive) / s.held, 0)} %` : '—');

/** A day as its bar's tooltip says it, in `gpujobs describe`'s words:
 * "2026-12-03: held 12.0 GPU-h: 10.0 productive (83 %), 1.5 failed, 0.5 stalled". */
export function dayText(day, s) {
  if (!s || s.held <= 0) return `${day}: no GPU time`;
  return `${day}: ${usageSentence({ gpu_seconds: s.held, productive_gpu_seconds: s.productive, lost_gpu_seconds: s.lost })}`;
}

/** The totals as [term, words]: held, productive, goodput, lost (by cause, the legend's
 * words), in one unit (the held time's). */
export function totalsOf(s) {
  if (s.held <= 0) return [['Held', 'no GPU time']];
  const unit = unitOf(s.held);
  const lostSum = Object.values(s.lost).reduce((a, b) => a + b, 0);
  const causes = partsOf(s).slice(1);
  return [
    ['Held', `${amount(s.held, unit)} ${unit}`],
    ['Productive', `${amount(s.productive, unit)} ${unit}`],
    ['Goodput', goodput(s)],
    ['Lost', `${amount(lostSum, unit)} ${unit}${causes.length ? `: ${causes.map(([p, v]) => `${amount(v, unit)} ${partName(p)}`).join(', ')}` : ''}`],
  ];
}

/** A pleasant scale for `max` (in units): [top, step], at most five steps. */
export function scaleOf(max) {
  if (!(max > 0)) return [1, 1];
  const raw = max / 5;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  return [Math.ceil(max / step - 1e-9) * step, step];
}

const tickLabel = (v) => String(Number(v.toFixed(3)));

// -- drawing -------------------------------------------------------------------

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v != null) el.setAttribute(k, String(v));
  for (const c of children.flat(Infinity)) if (c != null) el.append(c);
  return el;
}

const pct = (x) => `${(100 * x).toFixed(3)}%`;
/** px (style.css svg.us-chart): the plot from TOP to height - BOTTOM, the day labels under it */
const HEIGHT = { all: 150, group: 110 };
const TOP = 6;
const BOTTOM = 20;

/** One chart (size: all or group): a bar a day, stacked by part, the y axis in `unit` up to `top` seconds. */
function chart(size, days, byDay, topSeconds, unit, name, used) {
  const [top, step] = scaleOf(topSeconds / UNIT_S[unit]);
  const height = HEIGHT[size];
  const plot = height - TOP - BOTTOM;
  const y = (seconds) => TOP + plot * (1 - seconds / UNIT_S[unit] / top);
  const n = days.length;
  const every = n <= 10 ? 1 : Math.ceil(n / 7);
  const ticks = [];
  for (let v = 0; v <= top + 1e-9; v += step) ticks.push(v);
  const grid = ticks.map((v) => {
    const at = y(v * UNIT_S[unit]);
    return [svg('line', { class: v === 0 ? 'us-base' : 'us-grid', x1: 0, x2: '100%', y1: at, y2: at }),
      svg('text', { class: 'us-tick', x: -6, y: at + 4, 'text-anchor': 'end' }, tickLabel(v))];
  });
  const bars = days.map((day, i) => {
    const s = byDay.get(day) || blank();
    let acc = 0;
    const segs = partsOf(s).filter(([, v]) => v > 0).map(([p, v]) => {
      used.add(PARTS[p] ? p : 'other');
      const from = acc;
      acc += v;
      return svg('rect', {
        class: `tl-seg tl-${PARTS[p] ? p : 'other'}`, x: pct((i + 0.14) / n), width: pct(0.72 / n),
        y: y(acc), height: Math.max(0, y(from) - y(acc)), 'data-part': p, 'data-gpu-seconds': v,
      }, svg('title', {}, `${day}: ${partName(p)} ${amount(v, unit)} ${unit}`));
    });
    const label = i % every === (n - 1) % every
      ? svg('text', { class: 'us-day-label', x: pct((i + 0.5) / n), y: height - 4, 'text-anchor': 'middle' }, dayShort(day)) : null;
    return svg('g', { class: 'us-day', 'data-day': day, 'data-gpu-seconds': s.held },
      svg('title', {}, dayText(day, s)),
      svg('rect', { class: 'us-hit', x: pct(i / n), width: pct(1 / n), y: TOP, height: plot }),
      segs, label);
  });
  return svg('svg', { class: `us-chart us-${size}`, role: 'img',
    'aria-label': `${name}: GPU time a day (${unit}), ${days[0]} to ${days[n - 1]} (UTC); the table below gives each day` },
  grid, bars);
}

function panel(id, title, sum, chartEl, unit, extra) {
  const lead = sum.held > 0 ? `held ${amount(sum.held, unitOf(sum.held))} ${unitOf(sum.held)}, ${goodput(sum)} goodput` : 'no GPU time';
  return h('section', { class: 'us-panel', id, 'aria-label': title },
    h('h3', {}, extra || title),
    h('p', { class: 'muted small us-lead', text: `${lead} · ${unit} a day` }), chartEl);
}

function table(rows, by, days) {
  const causes = [];
  for (const p of Object.keys(PARTS)) if (p !== 'productive' && rows.some((r) => (secondsOf(r).lost[p] || 0) > 0)) causes.push(p);
  for (const r of rows) for (const [p, v] of Object.entries(secondsOf(r).lost)) if (!PARTS[p] && v && !causes.includes(p)) causes.push(p);
  const tenants = new Set(rows.map((r) => r.tenant));
  const manyTenants = tenants.size > 1;
  const head = ['Day (UTC)'].concat(manyTenants ? ['Tenant'] : [], by ? [groupHead(by)] : [],
    ['GPU-h held', 'Productive', 'Goodput'], causes.map((c) => partName(c)), ['Jobs']);
  const hours = (s) => fixed(s / 3600, 2);
  const cells = (s) => [hours(s.held), hours(s.productive), goodput(s)].concat(causes.map((c) => hours(s.lost[c] || 0)))
    .map((t) => h('td', { class: 'num', text: t }));
  const body = [];
  const model = usageModel(rows, days, by);
  const byDayRows = new Map();
  for (const r of rows) {
    const d = String(r.start).slice(0, 10);
    if (!byDayRows.has(d)) byDayRows.set(d, []);
    byDayRows.get(d).push(r);
  }
  let shown = 0;
  for (const d of model.days) {
    const list = byDayRows.get(d) || [];
    if (!list.length) continue;
    if (by || manyTenants) {
      body.push(h('tr', { class: 'us-day-total', dataset: { day: d } }, h('th', { scope: 'row', text: d }),
        manyTenants ? h('td', { text: 'all' }) : null, by ? h('td', { text: 'all' }) : null,
        cells(model.byDay.get(d)), h('td', { class: 'num', text: '' })));
    }
    for (const r of list) {
      if (shown++ >= MAX_TABLE_ROWS) break;
      body.push(h('tr', { dataset: { day: d } }, h('td', { text: d }), manyTenants ? h('td', { text: r.tenant }) : null,
        by ? h('td', { text: groupTitle(by, valueOf(r) ?? null) }) : null, cells(add(blank(), secondsOf(r))),
        h('td', { class: 'num', text: r.jobs ?? '' })));
    }
  }
  const cut = rows.length > MAX_TABLE_ROWS
    ? h('p', { class: 'muted small', text: `The first ${MAX_TABLE_ROWS.toLocaleString()} of ${rows.length.toLocaleString()} rows; gpujobs usage --csv gives them all.` }) : null;
  return [h('table', { id: 'usage-table' },
    h('caption', { class: 'sr-only', text: 'GPU-hours by day' }),
    h('thead', {}, h('tr', {}, head.map((t, i) => h('th', { scope: 'col', class: i >= head.length - causes.length - 4 ? 'num' : null, text: t })))),
    h('tbody', {}, body),
    h('tfoot', {}, h('tr', { class: 'us-total' }, h('th', { scope: 'row', text: 'Total' }), manyTenants ? h('td') : null, by ? h('td') : null,
      cells(model.total), h('td')))), cut];
}

// -- the page ----------------------------------------------------------------------

export function mount(main, _params, hash) {
  document.title = 'Usage · gpujobs';
  let settings = settingsOf(hash);
  const daysSel = h('select', { id: 'usage-days', name: 'days' },
    PERIODS.map((d) => h('option', { value: d, text: `last ${d} days` })));
  const bySel = h('select', { id: 'usage-by', name: 'by' },
    [['label', 'a label'], ['gpu_type', 'GPU type'], ['job', 'job'], ['', 'nothing (all together)']]
      .map(([v, t]) => h('option', { value: v, text: t })));
  const keys = h('datalist', { id: 'usage-keys' });
  const keyInput = h('input', { id: 'usage-key', name: 'key', list: 'usage-keys', size: 14, spellcheck: 'false', autocomplete: 'off' });
  const keyLabel = h('label', { class: 'inline', for: 'usage-key' }, 'Label key ', keyInput);
  const formError = h('p', { class: 'error', role: 'alert', id: 'usage-form-error' });
  const form = h('form', { class: 'toolbar', id: 'usage-controls', 'aria-label': 'What to show' },
    h('label', { class: 'inline', for: 'usage-days' }, 'Period ', daysSel),
    h('label', { class: 'inline', for: 'usage-by' }, 'Group by ', bySel), keyLabel, keys,
    h('button', { type: 'submit', text: 'Show' }));
  // not a live region: it changes at every refresh, and the totals say what changed
  const status = h('p', { id: 'usage-status', class: 'muted small' });
  const error = h('p', { class: 'error', role: 'alert', id: 'usage-error' });
  const totals = h('dl', { class: 'us-totals', id: 'usage-totals', 'aria-label': 'Totals' });
  const legend = h('ul', { class: 'legend', id: 'usage-legend', 'aria-label': 'Legend of the usage charts' });
  const overall = h('div', { id: 'usage-all' });
  const panels = h('div', { class: 'us-panels', id: 'usage-groups' });
  const groupsHead = h('h2', { id: 'usage-groups-head', hidden: true });
  const tableBox = h('div', { class: 'table-wrap' });
  const details = h('details', { class: 'tl-table', id: 'usage-details' },
    h('summary', { text: 'The usage as a table' }), tableBox);
  const none = h('p', { class: 'muted', id: 'usage-none', hidden: true });
  main.append(h('h1', { text: 'Usage' }),
    h('p', { class: 'muted', text: 'GPU time your jobs held by UTC day: what was productive, and where the rest went, in the job timeline\'s colours (gpujobs usage prints the same).' }),
    form, formError, status, error, totals, none, legend, overall,
    groupsHead, panels, details);

  function show() {
    daysSel.value = String(settings.days);
    const label = settings.by.startsWith('label:');
    bySel.value = label ? 'label' : settings.by;
    if (label) keyInput.value = settings.by.slice('label:'.length);
    else if (!keyInput.value) keyInput.value = DEFAULT_BY.slice('label:'.length);
    keyLabel.hidden = !label;
  }
  show();

  function apply(e) {
    if (e) e.preventDefault();
    keyLabel.hidden = bySel.value !== 'label';
    const key = keyInput.value.trim();
    if (bySel.value === 'label' && !key) {
      setText(formError, 'Name the label to group by (e.g. team).');
      return;
    }
    formError.textContent = '';
    settings = { days: Number(daysSel.value), by: bySel.value === 'label' ? `label:${key}` : bySel.value };
    history.replaceState(null, '', addressOf(settings));
    poller.now();
  }
  form.addEventListener('submit', apply);
  daysSel.addEventListener('change', apply);
  bySel.addEventListener('change', apply);
  keyInput.addEventListener('change', apply);

  let drawn = null;
  function draw(rows, s, days) {
    const key = JSON.stringify([rows, s, days]);
    if (key === drawn) return;
    drawn = key;
    const model = usageModel(rows, days, s.by);
    totals.replaceChildren(...totalsOf(model.total).map(([t, d]) => h('div', { class: `us-term-${t.toLowerCase()}` },
      h('dt', { text: t }), h('dd', { text: d }))));
    const empty = model.total.held <= 0;
    none.hidden = !empty;
    setText(none, empty ? `No GPU time in the last ${s.days} days.` : '');
    const used = new Set();
    const allUnit = unitOf(Math.max(0, ...model.days.map((d) => model.byDay.get(d).held)));
    const allTop = Math.max(0, ...model.days.map((d) => model.byDay.get(d).held));
    const allTitle = s.by ? `All ${groupHead(s.by) === 'Job' ? 'jobs' : 'groups'} together` : 'All jobs';
    overall.replaceChildren(empty ? '' : panel('usage-panel-all', allTitle, model.total,
      chart('all', model.days, model.byDay, allTop, allUnit, allTitle, used), allUnit));
    const groupTop = Math.max(0, ...model.groups.flatMap((g) => [...g.byDay.values()].map((v) => v.held)));
    const groupUnit = unitOf(groupTop);
    groupsHead.hidden = empty || !s.by;
    setText(groupsHead, s.by ? `By ${groupHead(s.by) === 'Job' ? 'job' : groupHead(s.by)}` : '');
    panels.replaceChildren(...(empty || !s.by ? [] : model.groups.map((g, i) => panel(`usage-panel-${i}`, g.title, g.total,
      chart('group', model.days, g.byDay, groupTop, groupUnit, g.title, used), groupUnit,
      s.by === 'job' && g.value != null ? h('a', { href: `#/jobs/${encodeURIComponent(g.value)}`, text: g.title }) : null))));
    legend.hidden = empty;
    legend.replaceChildren(...Object.keys(PARTS).concat(['other']).filter((p) => used.has(p)).map((p) => h('li', { dataset: { part: p } },
      h('span', { class: `swatch tl-swatch tl-${p}` }), h('span', { text: PARTS[p] || 'other' }))));
    tableBox.replaceChildren(...(rows.length ? table(rows, s.by, days) : [h('p', { class: 'muted', text: 'No rows.' })]));
  }

  let shown = null; // the settings drawn last
  async function refresh() {
    for (;;) {
      const s = settings;
      const days = dayKeys(Date.now(), s.days);
      try {
        if (s !== shown) setText(status, `Loading the last ${s.days} days…`);
        const data = await api.usage({ start: `${days[0]}T00:00:00Z`, granularity: 'day', group_by: s.by || null });
        if (s !== settings) continue; // changed meanwhile: ask again
        draw((data && data.rows) || [], s, days);
        shown = s;
        error.textContent = '';
        setText(status, `${days[0]} to ${days[days.length - 1]} (UTC; today so far), ${s.by ? `grouped by ${groupHead(s.by).toLowerCase() === 'job' ? 'job' : groupHead(s.by)}` : 'not grouped'}; read at ${clock()}.`);
      } catch (e) {
        if (s !== settings) continue;
        setText(status, '');
        setText(error, e instanceof ApiError && [404, 405, 501].includes(e.status)
          ? 'This server has no usage endpoint (GET /v1/usage).' : `Could not read the usage: ${problemText(e)}`);
      }
      return;
    }
  }
  const poller = poll(refresh, REFRESH_MS);
  // the label keys of the caller's latest jobs, offered as the key's choices
  api.listJobs({ pageSize: 100 }).then(({ jobs }) => {
    const seen = [...new Set((jobs || []).flatMap((j) => Object.keys((j.spec && j.spec.labels) || {})))].sort();
    keys.replaceChildren(...seen.map((k) => h('option', { value: k })));
  }).catch(() => {});
  return () => poller.stop();
}
