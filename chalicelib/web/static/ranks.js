// Ranks: a heatmap of every rank's silence against the stall threshold, one
// cell per rank, laid out by node, drawn on a canvas (fast at 16,384 ranks).
// Everything it shows is also text: the summary, the cell under the pointer
// or keyboard cursor, and a table.
import { api } from './api.js';
import { h, setText, stateBadge, seconds, time, clock, ranges, naturalCompare, poll, problemText, count, noun, TERMINAL } from './dom.js';
import { verdictOf, verdictLines, markOf } from './verdict.js';

const REFRESH_MS = 2000;
const TABLE_CHUNK = 500;
const STATUS_KEYS = ['exited', 'stopped', 'paused', 'busy', 'not_instrumented'];
/** Answers that polling again cannot change: the refresh stops on them. */
const GONE = new Set([401, 403, 404]);

function css(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

function palette() {
  const p = {};
  for (const k of ['ok', 'warn', 'stall', 'stall-deep', 'never', 'exited', 'stopped', 'paused', 'busy',
    'not_instrumented', 'named', 'suspect', 'cursor', 'bg', 'fg', 'grid']) p[k] = css(`--hm-${k.replace('_', '-')}`);
  return p;
}

function rgb(hex) {
  const n = parseInt(hex.replace('#', ''), 16);
  return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
}

function mix(a, b, t) {
  const x = rgb(a); const y = rgb(b);
  return `rgb(${x.map((v, i) => Math.round(v + (y[i] - v) * t)).join(',')})`;
}

/** The colour steps: green to amber as silence nears the threshold, red to deep red beyond. */
function scaleOf(pal) {
  return {
    ok: Array.from({ length: 16 }, (_, i) => mix(pal.ok, pal.warn, i / 15)),
    stall: Array.from({ length: 8 }, (_, i) => mix(pal.stall, pal['stall-deep'], i / 7)),
  };
}

/** The server's rank statuses that read differently in words (the CLI's). */
const STATUS_WORDS = { awaiting_first_beat: 'waiting for the first beat', not_instrumented: 'not instrumented' };

/** What a rank is, in words: the server's status when it says one, else derived. */
export function rankStatus(r, threshold) {
  if (r.status) return STATUS_WORDS[r.status] || r.status;
  if (r.paused) return 'paused';
  if (r.stalled) return 'stalled';
  if (r.last_heard_at == null) return 'never heard';
  return threshold && r.silence_s > threshold / 2 ? 'silent' : 'ok';
}

export function colourOf(r, threshold, pal, scale) {
  const s = r.status || (r.paused ? 'paused' : null);
  if (s && STATUS_KEYS.includes(s)) return pal[s];
  const ratio = threshold ? r.silence_s / threshold : 0;
  if (r.stalled || s === 'stalled' || ratio > 1) return scale.stall[Math.min(scale.stall.length - 1, Math.floor((ratio - 1) / 2 * scale.stall.length))] || scale.stall[0];
  if (r.last_heard_at == null) return pal.never;
  return scale.ok[Math.min(scale.ok.length - 1, Math.floor(ratio * scale.ok.length))];
}

/** The largest cell drawn (a job of a few ranks), and the height the map
 * keeps to when its cells can still be at least READABLE px (else up to
 * maxHeight, the smallest cell 3 px: 16,384 ranks on about one screen). */
export const MAX_CELL = 72;
const READABLE = 12;
const SNUG = 480;

/** Cells grouped by node: every node a block of cells, blocks flowed into
 * lines; the cells as big as the rank count lets them be. */
export function layout(ranks, width, maxHeight = 720) {
  const byNode = new Map();
  for (const r of ranks) {
    const n = r.node_id || '?';
    if (!byNode.has(n)) byNode.set(n, []);
    byNode.get(n).push(r);
  }
  const nodes = [...byNode.keys()].sort(naturalCompare).map((id) => ({ id, ranks: byNode.get(id).sort((a, b) => a.rank - b.rank) }));
  const maxPer = Math.max(1, ...nodes.map((n) => n.ranks.length));
  const cols = maxPer <= 32 ? maxPer : Math.ceil(Math.sqrt(maxPer * 4));
  const rows = Math.ceil(maxPer / cols);
  let L;
  let snug = true;
  for (let cell = MAX_CELL; cell >= 3; cell--) {
    if (snug && cell < READABLE) { snug = false; cell = MAX_CELL; } // nothing readable fits SNUG: up to maxHeight
    const gap = cell >= 8 ? 2 : 1;
    const pitch = cell + gap;
    const label = cell >= 10 ? 16 : 0;
    const blockW = cols * pitch - gap;
    const blockH = rows * pitch - gap + label;
    const sepX = Math.max(8, Math.min(24, cell));
    const sepY = Math.max(6, Math.min(12, Math.round(cell / 2)));
    const perLine = Math.max(1, Math.floor((width + sepX) / (blockW + sepX)));
    const lines = Math.ceil(nodes.length / perLine);
    const height = lines * (blockH + sepY) + 4;
    L = { nodes, cols, rows, cell, gap, pitch, label, blockW, blockH, sepX, sepY, perLine, lines, width, height };
    if (height <= (snug ? Math.min(SNUG, maxHeight) : maxHeight)) break;
  }
  nodes.forEach((n, i) => {
    n.x = 2 + (i % L.perLine) * (L.blockW + L.sepX);
    n.y = 2 + Math.floor(i / L.perLine) * (L.blockH + L.sepY);
  });
  L.where = new Map();
  nodes.forEach((n, ni) => n.ranks.forEach((r, i) => L.where.set(r.rank, [ni, i])));
  return L;
}

export function cellBox(L, ni, i) {
  const n = L.nodes[ni];
  return [n.x + (i % L.cols) * L.pitch, n.y + L.label + Math.floor(i / L.cols) * L.pitch, L.cell, L.cell];
}

export function hit(L, x, y) {
  const line = Math.floor((y - 2) / (L.blockH + L.sepY));
  const col = Math.floor((x - 2) / (L.blockW + L.sepX));
  if (line < 0 || col < 0 || col >= L.perLine) return null;
  const ni = line * L.perLine + col;
  const n = L.nodes[ni];
  if (!n) return null;
  const cx = Math.floor((x - n.x) / L.pitch);
  const cy = Math.floor((y - n.y - L.label) / L.pitch);
  if (cx < 0 || cy < 0 || cx >= L.cols || cy >= L.rows) return null;
  const i = cy * L.cols + cx;
  return i < n.ranks.length ? n.ranks[i] : null;
}

/** Black or white, whichever reads on the fill colour ("#rrggbb" or "rgb(r,g,b)"). */
function inkOn(fill) {
  const m = String(fill).match(/\d+/g);
  const [r, g, b] = fill.startsWith('#') ? rgb(fill) : (m || [0, 0, 0]).map(Number);
  return 0.299 * r + 0.587 * g + 0.114 * b > 150 ? '#000000' : '#ffffff';
}

function draw(canvas, L, data, health, verdict, pal, cursor) {
  const t0 = performance.now();
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(L.width * dpr);
  canvas.height = Math.round(L.height * dpr);
  canvas.style.width = `${L.width}px`;   // CSSOM, allowed by the CSP (no style attribute)
  canvas.style.height = `${L.height}px`;
  const g = canvas.getContext('2d', { alpha: false });
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.fillStyle = pal.bg;
  g.fillRect(0, 0, L.width, L.height);
  const threshold = data.threshold_s;
  const scale = scaleOf(pal);
  g.font = '12px system-ui, sans-serif';
  g.textBaseline = 'top';
  L.nodes.forEach((n, ni) => {
    if (L.label) {
      g.fillStyle = n.id === health.suspect_node ? pal.suspect : pal.fg;
      const text = n.id === health.suspect_node ? `⚠ ${n.id} (suspect)` : n.id;
      g.save(); g.beginPath(); g.rect(n.x, n.y, L.blockW, L.label); g.clip();
      g.fillText(text, n.x, n.y + 1); g.restore();
    }
    for (let i = 0; i < n.ranks.length; i++) {
      const r = n.ranks[i];
      const [x, y, w] = cellBox(L, ni, i);
      const fill = colourOf(r, threshold, pal, scale);
      g.fillStyle = fill;
      g.fillRect(x, y, w, w);
      if (r.stalled && w >= 8 && w < 24) { // not by colour alone: a slash on stalled cells
        g.strokeStyle = pal.bg; g.lineWidth = 1.5;
        g.beginPath(); g.moveTo(x + 2, y + w - 2); g.lineTo(x + w - 2, y + 2); g.stroke();
      }
      if (w >= 24) { // a big cell says its rank (and its silence), and a stalled one has a corner cut
        g.fillStyle = inkOn(fill);
        g.textAlign = 'center'; g.textBaseline = 'middle';
        g.font = `600 ${Math.min(18, Math.floor(w / 2.6))}px system-ui, sans-serif`;
        g.fillText(String(r.rank), x + w / 2, y + (w >= 48 ? w * 0.38 : w / 2));
        if (w >= 48) {
          g.font = `${Math.min(13, Math.floor(w / 4.5))}px system-ui, sans-serif`;
          g.fillText(seconds(r.silence_s), x + w / 2, y + w * 0.7);
        }
        if (r.stalled) {
          g.fillStyle = pal.bg;
          g.beginPath(); g.moveTo(x + w - 10, y); g.lineTo(x + w, y); g.lineTo(x + w, y + 10); g.fill();
        }
        g.textAlign = 'start'; g.textBaseline = 'top'; g.font = '12px system-ui, sans-serif';
      }
    }
    if (n.id === health.suspect_node) {
      g.strokeStyle = pal.suspect; g.lineWidth = 2; g.setLineDash([4, 3]);
      g.strokeRect(n.x - 3, n.y - 2, L.blockW + 6, L.blockH + 4);
      g.setLineDash([]);
    }
  });
  const ring = (rank, colour, dash, width) => {
    const at = L.where.get(rank);
    if (!at) return;
    const [x, y, w] = cellBox(L, ...at);
    g.strokeStyle = colour; g.lineWidth = width; g.setLineDash(dash);
    g.strokeRect(x - width / 2 - 1, y - width / 2 - 1, w + width + 2, w + width + 2);
    g.setLineDash([]);
  };
  const named = verdict ? verdict.ranks : [];
  for (const r of named) ring(r, pal.named, [], 3);
  if (cursor != null) ring(cursor, pal.cursor, [], 2);
  const ms = performance.now() - t0;
  canvas.dataset.drawMs = ms.toFixed(1);
  canvas.dataset.cells = String(data.ranks.length);
  canvas.dataset.named = named.join(','); // the outlined cells, as text (and for tests)
  return ms;
}

function summaryLines(job, data, verdict) {
  const hl = job.health || {};
  const byRank = new Map(data.ranks.map((r) => [r.rank, r]));
  const th = data.threshold_s;
  const out = [];
  const describe = (rank) => {
    const r = byRank.get(rank);
    return r ? `rank ${rank} on ${r.node_id} (silent ${seconds(r.silence_s)}, step ${r.step ?? '—'})` : `rank ${rank}`;
  };
  const stalled = hl.status === 'STALLED';
  if (verdict) out.push(...verdictLines(verdict));
  else if (stalled) out.push(['verdict', 'Stalled: the server names no rank that stopped.']);
  if (stalled) {
    // evidence under the verdict, said as an order, never as a second culprit
    out.push(['order', silenceOrder(data.ranks, th)]);
    const co = (hl.co_first || []).map((c) => (typeof c === 'object' ? c.rank : c)).filter((r) => r !== hl.first_stalled_rank);
    if (co.length) out.push(['co', `Within the jitter band of the longest silence (co-first): ${noun(co.length, 'rank')} ${ranges(co)}.`]);
    if (hl.suspect_node) out.push(['suspect', `Suspect node: ${hl.suspect_node}.`]);
    const stalledCount = data.ranks.filter((r) => r.stalled).length;
    out.push(['count', `${stalledCount} of ${count(data.ranks.length, 'rank')} stalled${hl.detected_at ? `; detected ${time(hl.detected_at)}` : ''}.`]);
  } else if (!verdict) {
    const top = data.ranks[0];
    out.push(['verdict', th == null ? 'No stall threshold yet (the job has not run).'
      : `No rank is stalled. Threshold ${seconds(th)}${top ? `; longest silence: ${describe(top.rank)}` : ''}.`]);
  }
  const counts = {};
  for (const r of data.ranks) { const s = rankStatus(r, th); counts[s] = (counts[s] || 0) + 1; }
  out.push(['counts', Object.entries(counts).map(([k, v]) => `${v} ${k}`).join(' · ')]);
  for (const text of slowLines(job, data)) out.push(['slow', text]);
  return out;
}

/** The sentence of each rank the server calls slow ("rank 1 on local-2 is
 * slow: its steps take 2.4× the fastest rank's"): the ranks view's
 * slow_text, else the job's health (slow_ranks, each episode's sentence). */
export function slowLines(job, data) {
  const hl = (job || {}).health || {};
  const texts = new Map();
  for (const r of hl.slow_ranks || []) {
    const s = (((hl.slow || {}).ranks || {})[String(r)]) || {};
    texts.set(r, s.text || `rank ${r} is slow`);
  }
  for (const r of (data || {}).ranks || []) if (r.slow_text) texts.set(r.rank, r.slow_text);
  return [...texts.keys()].sort((a, b) => a - b).map((r) => texts.get(r));
}

/** How many ranks the silence order spells out before "… and N more". */
const ORDER_SHOWN = 8;

/** "Silence order (evidence, longest first): 2 (61.0 s), 3 (60.9 s), 0 (1.0 s), 1 (0.9 s); threshold 12.0 s." */
export function silenceOrder(ranks, threshold) {
  const shown = ranks.slice(0, ORDER_SHOWN).map((r) => `${r.rank} (${seconds(r.silence_s)})`).join(', ');
  const more = ranks.length > ORDER_SHOWN ? `, … and ${(ranks.length - ORDER_SHOWN).toLocaleString()} more (the table lists every rank)` : '';
  return `Silence order (evidence, longest first): ${shown}${more}; threshold ${seconds(threshold)}.`;
}

/** ' (named)' or ' (tied)' after the status of a rank the verdict names, else ''. */
function markText(r, verdict) {
  return verdict && verdict.ranks.includes(r.rank) ? ` (${markOf(verdict)})` : '';
}

function rankText(r, th, verdict) {
  if (!r) return 'Point at a cell, or focus the map and use the arrow keys.';
  const ratio = th ? ` (${(r.silence_s / th).toFixed(2)} × threshold)` : '';
  const score = r.slow_score != null ? `, slow score ${Number(r.slow_score).toFixed(2)}${r.slow_text ? ' (slow)' : ''}` : '';
  return `Rank ${r.rank} on ${r.node_id}: ${rankStatus(r, th)}${markText(r, verdict)}, silent ${seconds(r.silence_s)}${ratio}, step ${r.step ?? '—'}${score}, last heard ${r.last_heard_at ? time(r.last_heard_at) : 'never'}.`;
}

// -- the history strip: the last minutes of each rank's silence, as polled ----
/** How far back the strip reaches, and up to how many ranks get a row each
 * (more: a row a node, its most silent rank's colour). */
export const HISTORY_S = 300;
const HISTORY_ROWS = 64;
const HISTORY_LABEL = 84;

/** What the page polled while open: at each poll, every row's colour. The
 * server keeps no history of silence; this is the page's own, lost on leaving. */
class History {
  constructor() { this.samples = []; this.key = null; this.rows = []; }

  add(data, pal, scale, now = Date.now()) {
    const byRank = data.ranks.length <= HISTORY_ROWS;
    const key = `${data.key}:${byRank}`;
    if (key !== this.key) { // a new attempt (or ranks placed): a history of its own
      this.key = key;
      this.samples = [];
      this.rows = byRank ? [...data.ranks].map((r) => r.rank).sort((a, b) => a - b).map((r) => ({ id: r, label: `rank ${r}` }))
        : [...new Set(data.ranks.map((r) => r.node_id || '?'))].sort(naturalCompare).map((n) => ({ id: n, label: n }));
    }
    const worst = new Map(); // row id -> the rank that colours it
    const th = data.threshold_s || 0;
    for (const r of data.ranks) {
      const id = byRank ? r.rank : (r.node_id || '?');
      const w = worst.get(id);
      if (!w || (r.stalled && !w.stalled) || (r.stalled === w.stalled && r.silence_s > w.silence_s)) worst.set(id, r);
    }
    this.samples.push({ t: now, colours: this.rows.map((row) => (worst.has(row.id) ? colourOf(worst.get(row.id), th, pal, scale) : null)) });
    while (this.samples.length > 1 && this.samples[1].t < now - HISTORY_S * 1000) this.samples.shift();
  }
}

function drawHistory(canvas, hist, width, pal, now = Date.now()) {
  const rows = hist.rows.length;
  const rowH = Math.max(2, Math.min(18, Math.floor(240 / Math.max(1, rows))));
  const axis = 16;
  const height = rows * rowH + axis + 4;
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * dpr); canvas.height = Math.round(height * dpr);
  canvas.style.width = `${width}px`; canvas.style.height = `${height}px`;
  const g = canvas.getContext('2d', { alpha: false });
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.fillStyle = pal.bg; g.fillRect(0, 0, width, height);
  const x0 = HISTORY_LABEL; const span = width - x0 - 4;
  const from = now - HISTORY_S * 1000;
  const xOf = (t) => x0 + Math.max(0, Math.min(1, (t - from) / (HISTORY_S * 1000))) * span;
  g.fillStyle = pal.grid; g.fillRect(x0, 0, span, rows * rowH); // before the page was open: nothing polled
  g.font = `${Math.min(12, rowH)}px system-ui, sans-serif`; g.textBaseline = 'middle';
  hist.rows.forEach((row, i) => {
    if (rowH >= 10) { g.fillStyle = pal.fg; g.fillText(row.label, 2, i * rowH + rowH / 2, x0 - 6); }
  });
  hist.samples.forEach((sm, k) => {
    const next = hist.samples[k + 1];
    const a = xOf(sm.t); const b = next ? xOf(next.t) : xOf(Math.min(now, sm.t + 2 * REFRESH_MS));
    sm.colours.forEach((c, i) => {
      if (!c) return;
      g.fillStyle = c; g.fillRect(a, i * rowH, Math.max(1, b - a), rowH - (rowH >= 6 ? 1 : 0));
    });
  });
  g.fillStyle = pal.fg; g.textBaseline = 'top'; g.font = '12px system-ui, sans-serif';
  for (let m = HISTORY_S / 60; m >= 0; m--) {
    const x = xOf(now - m * 60000);
    g.fillRect(x, rows * rowH, 1, 4);
    const text = m ? `−${m} min` : 'now';
    g.fillText(text, Math.min(x - (m ? 12 : 24), width - 28), rows * rowH + 4);
  }
  canvas.dataset.samples = String(hist.samples.length);
  canvas.dataset.rows = String(rows);
}

export function mount(main, [jobId]) {
  document.title = `Ranks of ${jobId} · gpujobs`;
  const pal = palette();
  let scale = null;
  const SCALE = () => (scale = scale || scaleOf(pal));
  const title = h('h1', { id: 'ranks-title', tabindex: -1, text: `Ranks of ${jobId}` });
  const badge = h('span');
  const summary = h('div', { id: 'stall-summary', class: 'summary', role: 'status', 'aria-live': 'polite' });
  const canvas = h('canvas', { id: 'heatmap', tabindex: 0, role: 'img', 'aria-describedby': 'stall-summary rank-info', 'aria-label': 'Heatmap of rank silence by node' });
  const info = h('p', { id: 'rank-info', class: 'rank-info', 'aria-live': 'polite' });
  const wrap = h('div', { class: 'heatmap-wrap' }, canvas);
  const tableBtn = h('button', { type: 'button', id: 'table-toggle', 'aria-pressed': 'false', 'aria-controls': 'rank-table-wrap', text: 'Show as table' });
  const tableWrap = h('div', { id: 'rank-table-wrap', hidden: true });
  const meta = h('p', { class: 'muted small', id: 'heatmap-meta' });
  const error = h('p', { class: 'error', role: 'alert' });
  const history = new History();
  const historyCanvas = h('canvas', { id: 'history', role: 'img', 'aria-label': `Each rank's silence over the last ${HISTORY_S / 60} minutes, as this page polled it` });
  const historyCaption = h('p', { id: 'history-caption', class: 'muted small' });
  const historyWrap = h('figure', { class: 'history' }, h('h2', { text: `The last ${HISTORY_S / 60} minutes` }), historyCanvas, historyCaption);
  const legend = h('ul', { class: 'legend', 'aria-label': 'Legend' },
    [['ok', 'beating (green → amber as silence nears the threshold)'], ['stall', 'stalled: silence > threshold (darker: longer)'],
      ['never', 'never heard (or waiting for its first beat)'], ['paused', 'declared pause'], ['busy', 'busy (I/O, e.g. checkpoint)'],
      ['exited', 'exited'], ['stopped', 'stopped'], ['not_instrumented', 'not instrumented'],
      ['named', 'outline: the rank the verdict names (every tied rank on a tie)'], ['suspect', 'dashed box: suspect node']]
      .map(([k, t]) => h('li', {}, h('span', { class: `swatch hm-${k.replace('_', '-')}`, 'aria-hidden': 'true' }), t)));
  // shown once the ranks are read: a job that is not there gets its message alone
  const body = h('div', { id: 'ranks-body', hidden: true }, summary,
    h('div', { class: 'toolbar' }, tableBtn, meta), wrap, info, legend, historyWrap, tableWrap);
  main.append(
    h('p', { class: 'crumbs' }, h('a', { href: '#/jobs', text: 'Jobs' }), ' / ', h('a', { href: `#/jobs/${encodeURIComponent(jobId)}`, id: 'back-to-job', text: jobId })),
    h('div', { class: 'title-row' }, title, badge), error, body);
  title.focus();

  let job = null; let data = null; let verdict = null; let L = null; let cursor = null; let shown = TABLE_CHUNK;
  canvas.boxOf_ = (rank) => { const at = L && L.where.get(rank); return at ? cellBox(L, ...at) : null; }; // for tests and tools

  function redraw() {
    if (!data) return;
    const width = Math.max(320, Math.floor(wrap.clientWidth) - 4);
    if (!L || L.width !== width || L.count !== data.ranks.length || L.key !== data.key) {
      L = layout(data.ranks, width);
      L.count = data.ranks.length; L.key = data.key;
    } else if (L.data !== data) { // the same places, this poll's ranks in them (not the first poll's)
      const now = new Map(data.ranks.map((r) => [r.rank, r]));
      for (const n of L.nodes) n.ranks = n.ranks.map((r) => now.get(r.rank) || r);
    }
    L.data = data;
    const ms = draw(canvas, L, data, job.health || {}, verdict, pal, cursor);
    if (history.samples.length) drawHistory(historyCanvas, history, width, pal);
    historyWrap.hidden = !data.ranks.length;
    setText(meta, `${count(data.ranks.length, 'rank')} on ${count(L.nodes.length, 'node')} · attempt ${data.attempt} · drawn in ${ms.toFixed(0)} ms · updated ${clock()}`);
  }

  function renderTable() {
    if (tableWrap.hidden || !data) return;
    const th = data.threshold_s;
    const rows = data.ranks.slice(0, shown).map((r) => h('tr', { class: r.stalled ? 'stalled' : null, dataset: { rank: r.rank } },
      h('td', { class: 'num', text: r.rank }), h('td', {}, h('code', { text: r.node_id })),
      h('td', { text: rankStatus(r, th) + markText(r, verdict) }),
      h('td', { class: 'num', text: seconds(r.silence_s) }), h('td', { class: 'num', text: th ? (r.silence_s / th).toFixed(2) : '—' }),
      h('td', { class: 'num', text: r.step ?? '—' }), h('td', { text: r.last_heard_at ? time(r.last_heard_at) : 'never' })));
    const more = data.ranks.length > shown ? h('button', { type: 'button', id: 'more-ranks', text: `Show ${Math.min(TABLE_CHUNK, data.ranks.length - shown)} more of ${data.ranks.length - shown}`, onclick: () => { shown += TABLE_CHUNK; renderTable(); } }) : null;
    tableWrap.replaceChildren(h('table', { id: 'rank-table', class: 'ranks' },
      h('caption', { text: 'Ranks, silent longest first' }),
      h('thead', {}, h('tr', {}, ['Rank', 'Node', 'Status', 'Silence', '÷ threshold', 'Step', 'Last heard'].map((t) => h('th', { scope: 'col', text: t })))),
      h('tbody', {}, rows)), more);
  }

  tableBtn.addEventListener('click', () => {
    const on = tableWrap.hidden;
    tableWrap.hidden = !on;
    tableBtn.setAttribute('aria-pressed', String(on));
    setText(tableBtn, on ? 'Hide table' : 'Show as table');
    renderTable();
  });

  const byRank = () => new Map(data.ranks.map((r) => [r.rank, r]));
  canvas.addEventListener('mousemove', (e) => {
    if (!L) return;
    const box = canvas.getBoundingClientRect();
    const r = hit(L, e.clientX - box.left, e.clientY - box.top);
    setText(info, rankText(r, data.threshold_s, verdict));
    canvas.classList.toggle('pointing', !!r);
  });
  canvas.addEventListener('keydown', (e) => {
    if (!L || !data.ranks.length) return;
    const order = L.nodes.flatMap((n) => n.ranks.map((r) => r.rank));
    let i = cursor == null ? -1 : order.indexOf(cursor);
    const step = { ArrowRight: 1, ArrowLeft: -1, ArrowDown: L.cols, ArrowUp: -L.cols, Home: -Infinity, End: Infinity }[e.key];
    if (step === undefined) return;
    e.preventDefault();
    i = i < 0 ? 0 : Math.max(0, Math.min(order.length - 1, i + (Number.isFinite(step) ? step : step > 0 ? order.length : -order.length)));
    cursor = order[i];
    setText(info, rankText(byRank().get(cursor), data.threshold_s, verdict));
    redraw();
  });
  canvas.addEventListener('focus', () => {
    if (cursor == null && data && data.ranks.length) {
      cursor = verdict ? (verdict.rank ?? verdict.ranks[0]) : data.ranks[0].rank;
      setText(info, rankText(byRank().get(cursor), data.threshold_s, verdict));
      redraw();
    }
  });
  const onResize = () => redraw();
  window.addEventListener('resize', onResize);

  async function refresh() {
    try {
      const [j, d] = await Promise.all([api.job(jobId), api.ranks(jobId)]);
      job = j;
      d.key = `${d.attempt}:${d.ranks.length}`;
      data = d;
      verdict = verdictOf(j, d);
      body.hidden = false;
      history.add(d, pal, SCALE());
      const ended = TERMINAL.has(j.state);
      setText(historyCaption, `${history.rows.length === d.ranks.length ? 'Each rank' : 'Each node (its most silent rank)'}: its silence ÷ threshold, coloured as in the map, at each of this page’s polls (every ${REFRESH_MS / 1000} s) since you opened it${ended ? ', until the job ended' : ''}. The server keeps no history of silence: the strip is this page’s own, grey before it was opened, and gone when you leave.`);
      setText(title, `Ranks of ${j.name || j.id}`);
      document.title = `Ranks of ${j.name || j.id} · gpujobs`;
      if (badge.dataset.state !== j.state) { badge.dataset.state = j.state; badge.replaceChildren(stateBadge(j.state)); }
      const lines = summaryLines(j, d, verdict);
      summary.replaceChildren(...lines.map(([k, t]) => h('p', { class: `sum-${k}`, text: t })));
      error.textContent = '';
      redraw();
      renderTable();
      if (!d.ranks.length) setText(info, 'This job has no ranks placed yet.');
      else if (cursor != null) setText(info, rankText(byRank().get(cursor), d.threshold_s, verdict));
      else if (!info.textContent) setText(info, rankText(null));
      if (TERMINAL.has(j.state)) poller.stop();
    } catch (e) {
      // a job id is never reused, and a refused token stays refused: a page
      // that is gone stays still (the sign-in form takes over on a 401)
      if (GONE.has(e.status)) poller.stop();
      if (e.status === 404) { body.remove(); setText(title, 'No such job'); document.title = 'No such job · gpujobs'; }
      setText(error, e.status === 404 ? `No job ${jobId} (or it belongs to another tenant).` : `Could not load the ranks: ${problemText(e)}`);
    }
  }
  const poller = poll(refresh, REFRESH_MS);
  return () => { poller.stop(); window.removeEventListener('resize', onResize); };
}
