// A job's timeline (issue 46): its attempts as bars over time, each cut by
// cause as the job's `usage` counts it, stalls, preemptions and node losses
// marked, a legend, the axis times and the usage sentence `gpujobs describe`
// prints. Drawn as SVG whose geometry is attributes (percentages: it follows
// the page's width) and whose colours are CSS classes (style.css): nothing
// inline, as the page's Content-Security-Policy asks.
//
// The attempts' spans come from the job's story (GET /v1/jobs/{id}/events,
// which the job page reads anyway) by the rules of chalicelib/domain/usage.py
// (spans_of, span_parts), so the bars add up to the job's `usage`, which the
// server works out from the same events: an attempt is its `placed` event to
// its first `retried` or `finished` (whose reason says what ended it); its
// startup runs to its `started` event; each `stalled` event opens a stall at
// its `last_heard_at`, closed by the attempt's next `recovered` (else its
// end); the rest is productive for an attempt that succeeded or still runs,
// else lost to what ended it. The ranks' steps are not in the story (nor
// recorded per attempt), so no share of a failed attempt is counted resumed,
// as the server counts none without them.
import { h, clock, time, noun } from './dom.js';

const SVG = 'http://www.w3.org/2000/svg';

/** An attempt's end reason -> the cause its lost time counts under (domain/usage.py CAUSES). */
export const CAUSES = {
  rank_failed: 'failed_attempt', port_in_use: 'failed_attempt', node_lost: 'node_lost',
  agent_lost: 'node_lost', preempted: 'preempted', cancelled: 'cancelled', stalled: 'stalled',
  timeout: 'timeout',
};

/** Each part's colour (a CSS class, tl-<part>) and its name in the legend, in the legend's order. */
export const PARTS = {
  productive: 'productive', startup: 'startup', stalled: 'stalled', checkpoint: 'checkpoint',
  failed_attempt: 'failed attempt', preempted: 'preempted', node_lost: 'node lost',
  cancelled: 'cancelled', timeout: 'timed out',
};

/** Each cause in the usage sentence's words (gpujobs_client/cli.py CAUSE_WORDS). */
const CAUSE_WORDS = {
  failed_attempt: 'failed', node_lost: 'node lost', startup: 'startup', stalled: 'stalled',
  preempted: 'preempted', cancelled: 'cancelled', checkpoint: 'checkpoint', timeout: 'timed out',
};

/** The markers: what each says in the legend. */
export const MARKS = { stall: 'stall (from the last beat)', preempted: 'preemption', node_lost: 'node loss' };

const ms = (iso) => Date.parse(iso);

/**
 * The job's attempts as spans, from its story (api.js normaliseEvents' shape:
 * {at, type, detail (the reason), extra: {attempt, last_heard_at, rank, ...}}),
 * as domain/usage.py spans_of reads it: [{attempt, gpus, placed, ended,
 * reason, started, end (the ending event), stalls: [{from, to, event}]}],
 * times in ms since the epoch, ended/started/to null while not (yet) so.
 */
export function attemptSpans(events, gpus) {
  const story = (events || [])
    .map((e, i) => ({ e, i, t: ms(e.at) }))
    .filter(({ e, t }) => Number.isInteger((e.extra || {}).attempt) && e.at && !Number.isNaN(t))
    .sort((a, b) => a.t - b.t || a.i - b.i);
  const byAttempt = new Map();
  const of = (n) => {
    if (!byAttempt.has(n)) byAttempt.set(n, { attempt: n, gpus, placed: null, ended: null, reason: null, started: null, end: null, stalls: [] });
    return byAttempt.get(n);
  };
  for (const { e, t } of story) {
    const n = e.extra.attempt;
    const a = of(n);
    if (e.type === 'placed') {
      if (a.placed == null) a.placed = t;
    } else if (e.type === 'started') {
      if (a.started == null) a.started = t;
    } else if ((e.type === 'retried' || e.type === 'finished') && a.placed != null) {
      if (a.ended == null) {
        a.ended = t;
        a.reason = e.detail || null;
        a.end = e;
      }
    } else if (e.type === 'stalled') {
      const since = e.extra.last_heard_at;
      a.stalls.push({ from: since ? ms(since) : t, to: null, event: e });
    } else if (e.type === 'recovered') {
      const open = a.stalls.find((s) => s.to == null);
      if (open) open.to = t;
    }
  }
  return [...byAttempt.values()].filter((a) => a.placed != null).sort((a, b) => a.attempt - b.attempt);
}

/** The stalls within [lo, hi), merged and sorted (usage.py _clipped). */
function clipped(stalls, lo, hi) {
  const cut = stalls.map((s) => [Math.max(lo, s.from), Math.min(hi, s.to == null ? hi : s.to)])
    .sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const out = [];
  for (const [a, b] of cut) {
    if (b <= a) continue;
    if (out.length && a <= out[out.length - 1][1]) out[out.length - 1][1] = Math.max(out[out.length - 1][1], b);
    else out.push([a, b]);
  }
  return out;
}

/** The cause an attempt's rest of time counts under: productive while it runs or once it succeeded. */
export function restCause(span) {
  if (span.ended == null || span.reason === 'succeeded') return 'productive';
  return CAUSES[span.reason] || 'failed_attempt';
}

/**
 * The attempt cut in time order: [{part, from, to}] (ms), a running attempt
 * up to `now`, and its GPU-milliseconds by part (usage.py span_parts, whose
 * sum is its GPUs x its held time exactly).
 */
export function spanSegments(span, now) {
  const placed = span.placed;
  const end = Math.max(placed, span.ended != null ? span.ended : now);
  let first;
  if (span.started != null) first = Math.min(end, Math.max(placed, span.started));
  else first = span.ended == null ? end : placed; // still starting, or ended before any rank started
  const rest = restCause(span);
  const segments = [];
  if (first > placed) segments.push({ part: 'startup', from: placed, to: first });
  let at = first;
  for (const [a, b] of clipped(span.stalls, first, end)) {
    if (a > at) segments.push({ part: rest, from: at, to: a });
    segments.push({ part: 'stalled', from: a, to: b });
    at = b;
  }
  if (end > at) segments.push({ part: rest, from: at, to: end });
  const parts = {};
  for (const s of segments) parts[s.part] = (parts[s.part] || 0) + (s.to - s.from) * span.gpus;
  return { from: placed, to: end, segments, parts };
}

// -- words ---------------------------------------------------------------------

/** A number to `digits` decimals as Python's format does it: an exact tie to even (0.25 -> "0.2"). */
export function fixed(x, digits) {
  const scaled = x * 10 ** digits;
  const floor = Math.floor(scaled);
  // a tie only when x is one exactly (x * 2^(digits+1) is exact: a whole number then)
  if (scaled - floor === 0.5 && Number.isInteger(x * 2 ** (digits + 1))) return ((floor % 2 === 0 ? floor : floor + 1) / 10 ** digits).toFixed(digits);
  return x.toFixed(digits);
}

/** GPU-seconds in `unit` (cli.py gpu_amount): GPU-h and GPU-min to a decimal, GPU-s whole. */
export function amount(seconds, unit) {
  if (unit === 'GPU-h') return fixed(seconds / 3600, 1);
  if (unit === 'GPU-min') return fixed(seconds / 60, 1);
  return fixed(seconds, 0);
}

export const unitOf = (seconds) => (seconds >= 3600 ? 'GPU-h' : seconds >= 60 ? 'GPU-min' : 'GPU-s');

/** GPU time with its unit: "1.5 GPU-h", "12.0 GPU-min", "42 GPU-s". */
export function gpuTime(seconds) {
  const unit = unitOf(seconds);
  return `${amount(seconds, unit)} ${unit}`;
}

/** How long, to the second: "42 s", "1 min 55 s", "2 h 5 min". */
export function lasted(seconds) {
  const t = Math.max(0, Math.round(seconds));
  if (t < 60) return `${t} s`;
  if (t < 3600) return `${Math.floor(t / 60)} min${t % 60 ? ` ${t % 60} s` : ''}`;
  const m = Math.floor((t % 3600) / 60);
  return `${Math.floor(t / 3600)} h${m ? ` ${m} min` : ''}`;
}

/** "attempt 1 (rank 3 exited 1)", "attempts 1, 2": the attempts (GET .../attempts)
 * that failed, as the usage sentence names them (cli.py failed_words). */
function failedWords(attempts) {
  const ended = (attempts || []).filter((a) => a.exit && ['rank_failed', 'port_in_use'].includes(a.exit.reason));
  if (ended.length === 1) {
    const e = ended[0].exit;
    const why = e.rank != null && e.exit_code != null ? ` (rank ${e.rank} exited ${e.exit_code})` : '';
    return `attempt ${ended[0].attempt}${why}`;
  }
  return ended.length ? `attempts ${ended.map((a) => a.attempt).join(', ')}` : '';
}

/** The job's usage as `gpujobs describe` says it (cli.py usage_sentence):
 * "held 12.4 GPU-h: 10.1 productive (81 %), 1.6 failed attempt 1 (rank 3
 * exited 1), 0.5 stalled, 0.2 startup"; null without a usage. */
export function usageSentence(usage, attempts = []) {
  if (!usage) return null;
  const held = usage.gpu_seconds || 0;
  if (held <= 0) return 'held no GPU time yet';
  const unit = unitOf(held);
  const lost = Object.entries(usage.lost_gpu_seconds || {})
    .sort(([a, x], [b, y]) => y - x || (a < b ? -1 : a > b ? 1 : 0));
  const words = [];
  const productive = usage.productive_gpu_seconds || 0;
  words.push(`${amount(productive, unit)} productive (${fixed((100 * productive) / held, 0)} %)`);
  for (const [part, seconds] of lost) {
    const label = CAUSE_WORDS[part] || part.replace(/_/g, ' ');
    const which = part === 'failed_attempt' ? failedWords(attempts) : '';
    words.push(`${amount(seconds, unit)} ${label}${which ? ` ${which}` : ''}`);
  }
  return `held ${amount(held, unit)} ${unit}: ${words.join(', ')}${usage.estimated ? ' (estimated: no steps recorded)' : ''}`;
}

/** How an attempt ended, in words: "failed (rank 3 exited 1)", "preempted (node n1
 * drained: bad ECC)", "node lost (node-2)", "succeeded", "running"; `exit` is
 * the attempt's own (GET .../attempts), else what its ending event says. */
export function endWords(span, exit) {
  if (span.ended == null) return span.started == null ? 'starting' : 'running';
  const x = exit || {};
  const said = { ...(span.end ? span.end.extra : {}), ...Object.fromEntries(Object.entries(x).filter(([, v]) => v != null)) };
  const reason = span.reason || x.reason;
  switch (reason) {
    case 'succeeded': return 'succeeded';
    case 'rank_failed':
      return `failed${said.rank != null && said.exit_code != null ? ` (rank ${said.rank} exited ${said.exit_code})`
        : said.rank != null ? ` (rank ${said.rank})` : ''}`;
    case 'port_in_use': return 'failed (its rendezvous port was in use)';
    case 'preempted': return `preempted${said.detail ? ` (${said.detail})` : ''}`;
    case 'node_lost': case 'agent_lost':
      return `node lost${said.node_id ? ` (${said.node_id})` : ''}`;
    case 'cancelled': return 'cancelled';
    case 'timeout': return 'timed out';
    case 'stalled': return 'stalled';
    default: return reason ? `failed (${String(reason).replace(/_/g, ' ')})` : 'ended';
  }
}

const partWords = (part) => PARTS[part] || part.replace(/_/g, ' ');

/** "stalled 2 min (4.0 GPU-min), 00:01:00–00:03:00 UTC": a bar's piece, as its tooltip says it. */
export function segmentText(seg, gpus) {
  const s = (seg.to - seg.from) / 1000;
  return `${partWords(seg.part)} ${lasted(s)} (${gpuTime(s * gpus)}), ${clock(new Date(seg.from)).slice(0, 8)}–${clock(new Date(seg.to))}`;
}

/** The attempt as one line: "attempt 1: failed (rank 3 exited 1); 2 GPUs for 2 min 5 s:
 * startup 5 s, failed attempt 2 min". */
export function attemptLine(span, cut, exit) {
  const pieces = {};
  for (const seg of cut.segments) pieces[seg.part] = (pieces[seg.part] || 0) + (seg.to - seg.from) / 1000;
  const order = Object.keys(PARTS).filter((p) => pieces[p]).concat(Object.keys(pieces).filter((p) => !PARTS[p]));
  return `attempt ${span.attempt}: ${endWords(span, exit)}; ${span.gpus} ${noun(span.gpus, 'GPU')} for ${lasted((cut.to - cut.from) / 1000)}`
    + `${order.length ? `: ${order.map((p) => `${partWords(p)} ${lasted(pieces[p])}`).join(', ')}` : ''}`;
}

/** The marks on an attempt: [{kind, at, text}]: each stall where it began
 * (its verdict and how long it lasted), a preemption or a node loss where the
 * attempt ended. */
export function marksOf(span, cut, exit) {
  const out = [];
  for (const s of span.stalls) {
    const from = Math.max(span.placed, s.from);
    const to = s.to == null ? cut.to : Math.min(cut.to, s.to);
    const who = s.event.detail ? `: ${s.event.detail}` : '';
    const until = s.to == null ? (span.ended == null ? ', still stalled' : ', until the attempt ended') : ', then recovered';
    out.push({ kind: 'stall', at: from, text: `stalled ${lasted(Math.max(0, to - from) / 1000)} from ${clock(new Date(from))}${until}${who}` });
  }
  const cause = span.ended != null ? CAUSES[span.reason] : null;
  if (cause === 'preempted' || cause === 'node_lost') {
    out.push({ kind: cause, at: span.ended, text: `attempt ${span.attempt} ${endWords(span, exit)} at ${clock(new Date(span.ended))}` });
  }
  return out;
}

// -- drawing -----------------------------------------------------------------

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v != null) el.setAttribute(k, String(v));
  for (const c of children.flat(Infinity)) if (c != null) el.append(c);
  return el;
}

const tip = (text) => svg('title', {}, text);

/** A marker's shape, centred on x = 0 at the bar's top (the bar spans y 10..30). */
function markShape(kind) {
  if (kind === 'stall') return svg('path', { d: 'M0 1 L5 6 L0 11 L-5 6 Z' }); // a diamond
  if (kind === 'preempted') return svg('path', { d: 'M-5 0 H5 L0 9 Z' }); // a triangle, pointing down
  return svg('path', { d: 'M-4 1 L4 9 M4 1 L-4 9', class: 'cross' }); // node lost: a cross
}

function markSwatch(kind) {
  return svg('svg', { class: `tl-swatch-mark m-${kind}`, width: 14, height: 14, viewBox: '-7 -1 14 14', 'aria-hidden': 'true' }, markShape(kind));
}

/** A pleasant step (ms) for axis ticks over `range`: at most about six. */
function tickStep(range) {
  const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400]
    .map((s) => s * 1000);
  return steps.find((s) => range / s <= 6) || Math.ceil(range / 6 / 86400000) * 86400000;
}

const pct = (x) => `${(100 * x).toFixed(3)}%`;

/**
 * The timeline's element, or a note when there is nothing to draw.
 * job: GET /v1/jobs/{id}; attempts: its attempts; events: normalised story.
 */
export function timelineView(job, attempts, events, now = Date.now()) {
  const sentence = usageSentence(job.usage, attempts);
  const total = h('p', { id: 'usage-total', class: 'usage-total' },
    sentence ? [h('strong', { text: 'GPU time: ' }), sentence] : null);
  const gpus = Number(job.spec.ranks || 0) * Number(job.spec.gpus_per_rank ?? 1);
  const spans = events ? attemptSpans(events, gpus) : [];
  if (!spans.length) {
    const why = events == null ? 'This server has no event timeline (GET /v1/jobs/{id}/events) to draw the attempts from.'
      : 'Not placed yet: no GPU time held.';
    const held = sentence && (job.usage.gpu_seconds || 0) > 0;
    return h('div', {}, held ? total : null, h('p', { class: 'muted', id: 'timeline-none', text: why }));
  }
  const exits = new Map((attempts || []).map((a) => [a.attempt, a.exit]));
  // a big job's story holds thousands of events: no spread of them into arguments
  const latest = events.reduce((m, e) => { const t = ms(e.at); return Number.isNaN(t) ? m : Math.max(m, t); }, 0);
  const end = Math.max(now, latest);
  const cuts = spans.map((s) => spanSegments(s, end));
  const t0 = Math.min(...cuts.map((c) => c.from));
  const t1 = Math.max(t0 + 1000, ...cuts.map((c) => c.to));
  const x = (t) => (t - t0) / (t1 - t0);
  const running = spans.some((s) => s.ended == null);
  const used = new Set();
  const marked = new Set();

  const rows = spans.map((span, i) => {
    const cut = cuts[i];
    const exit = exits.get(span.attempt);
    const line = attemptLine(span, cut, exit);
    const marks = marksOf(span, cut, exit);
    const bar = svg('svg', { class: 'tl-bar', role: 'img', 'aria-label': `${line}${marks.length ? `; ${marks.map((m) => m.text).join('; ')}` : ''}` },
      tip(line),
      svg('rect', { class: 'tl-track', x: 0, y: 10, width: '100%', height: 20 }),
      cut.segments.map((seg) => {
        used.add(seg.part);
        return svg('rect', {
          class: `tl-seg tl-${PARTS[seg.part] ? seg.part : 'other'}`, x: pct(x(seg.from)), y: 10,
          width: pct(Math.max(0, x(seg.to) - x(seg.from))), height: 20,
          'data-part': seg.part, 'data-gpu-ms': (seg.to - seg.from) * span.gpus,
        }, tip(`attempt ${span.attempt}: ${segmentText(seg, span.gpus)}`));
      }),
      marks.map((m) => {
        marked.add(m.kind);
        return svg('svg', { x: pct(x(m.at)), y: 0, overflow: 'visible', class: 'tl-mark-at' },
          svg('g', { class: `tl-mark m-${m.kind}`, 'data-kind': m.kind }, tip(m.text),
            svg('line', { x1: 0, x2: 0, y1: 10, y2: 30 }), markShape(m.kind)));
      }));
    return h('div', { class: 'tl-row', dataset: { attempt: span.attempt } },
      h('div', { class: 'tl-label' }, h('span', { class: 'tl-name', text: `Attempt ${span.attempt}` }),
        h('span', { class: 'tl-end muted small', text: endWords(span, exit) })), bar);
  });

  // the axis: its first and last time in full (UTC, as every time here), ticks between
  const step = tickStep(t1 - t0);
  const ticks = [];
  for (let t = Math.ceil(t0 / step) * step; t < t1; t += step) {
    if (x(t) > 0.06 && x(t) < 0.94) ticks.push(t);
  }
  const label = (t) => (step < 60000 ? clock(new Date(t)).slice(0, 8) : clock(new Date(t)).slice(0, 5));
  const axis = svg('svg', { class: 'tl-axis', 'aria-hidden': 'true' },
    svg('line', { x1: 0, x2: '100%', y1: 2, y2: 2 }),
    ticks.map((t) => [svg('line', { x1: pct(x(t)), x2: pct(x(t)), y1: 2, y2: 7 }),
      svg('text', { x: pct(x(t)), y: 19, 'text-anchor': 'middle' }, label(t))]),
    svg('text', { x: 0, y: 19, 'text-anchor': 'start' }, clock(new Date(t0)).slice(0, 8)),
    svg('text', { x: '100%', y: 19, 'text-anchor': 'end' }, running ? 'now' : clock(new Date(t1)).slice(0, 8)));
  const span = h('p', { class: 'muted small', id: 'timeline-axis' },
    `From ${time(new Date(t0).toISOString())} to ${running ? 'now' : time(new Date(t1).toISOString())} (${lasted((t1 - t0) / 1000)})`);

  const legend = h('ul', { class: 'legend', id: 'timeline-legend', 'aria-label': 'Legend of the timeline' },
    Object.keys(PARTS).filter((p) => used.has(p)).map((p) => h('li', { dataset: { part: p } },
      h('span', { class: `swatch tl-swatch tl-${p}` }), h('span', { text: PARTS[p] }))),
    [...used].filter((p) => !PARTS[p]).length ? h('li', { dataset: { part: 'other' } },
      h('span', { class: 'swatch tl-swatch tl-other' }), h('span', { text: 'other' })) : null,
    Object.keys(MARKS).filter((k) => marked.has(k)).map((k) => h('li', { dataset: { mark: k } },
      markSwatch(k), h('span', { text: MARKS[k] }))));

  const table = h('details', { class: 'tl-table' }, h('summary', { text: 'The timeline as a table' }),
    h('table', { id: 'timeline-table' },
      h('thead', {}, h('tr', {}, ['Attempt', 'How it ended', 'Placed', 'Ended', 'GPUs', 'Time by cause', 'Marks']
        .map((t) => h('th', { scope: 'col', text: t })))),
      h('tbody', {}, spans.map((s, i) => {
        const exit = exits.get(s.attempt);
        const cut = cuts[i];
        return h('tr', { dataset: { attempt: s.attempt } },
          h('td', { class: 'num', text: s.attempt }), h('td', { text: endWords(s, exit) }),
          h('td', { text: time(new Date(s.placed).toISOString()) }),
          h('td', { text: s.ended == null ? 'running' : time(new Date(s.ended).toISOString()) }),
          h('td', { class: 'num', text: s.gpus }),
          h('td', {}, h('ul', { class: 'plain' }, cut.segments.map((seg) => h('li', { text: segmentText(seg, s.gpus) })))),
          h('td', {}, h('ul', { class: 'plain' }, marksOf(s, cut, exit).map((m) => h('li', { text: m.text })))));
      }))));

  return h('div', {}, total,
    h('div', { class: 'tl', id: 'timeline-bars', role: 'group', 'aria-label': 'Attempts over time' },
      rows, h('div', { class: 'tl-row tl-axis-row' }, h('span', {}), axis)),
    span, legend, table);
}
