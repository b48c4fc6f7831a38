// DOM helpers. Every string goes in as text (text nodes, textContent,
// attributes): nothing here, or anywhere in the dashboard, parses HTML.

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value == null || value === false) continue;
    if (key === 'class') el.className = value;
    else if (key === 'text') el.textContent = String(value);
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Replace el's text only when it changed (no layout work, no flicker). */
export function setText(el, text) {
  const s = text == null ? '' : String(text);
  if (el.textContent !== s) el.textContent = s;
}

/** Every time the dashboard shows is UTC with its zone said, as the CLI shows
 * it: "2026-12-07 17:19:16 UTC" (the page's footer says so once). */
export const ZONE = 'UTC';

export function time(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : `${d.toISOString().slice(0, 19).replace('T', ' ')} ${ZONE}`;
}

/** The time of day of a moment (default: now), UTC: "17:19:16 UTC". */
export function clock(d = new Date()) {
  return `${d.toISOString().slice(11, 19)} ${ZONE}`;
}

export function ago(iso, now = Date.now()) {
  if (!iso) return 'never';
  const s = Math.max(0, (now - new Date(iso).getTime()) / 1000);
  if (s < 60) return `${s.toFixed(0)} s ago`;
  if (s < 3600) return `${(s / 60).toFixed(0)} min ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return `${(s / 86400).toFixed(1)} d ago`;
}

export function seconds(s) {
  if (s == null) return '—';
  return s < 100 ? `${Number(s).toFixed(1)} s` : `${Number(s).toFixed(0)} s`;
}

/** A span of seconds, short: "42 s", "12 min", "3 h 5 min", "2 d 4 h". */
export function duration(s) {
  if (s == null || Number.isNaN(s)) return '—';
  const t = Math.max(0, Math.floor(s));
  if (t < 60) return `${t} s`;
  if (t < 3600) return `${Math.floor(t / 60)} min`;
  if (t < 86400) return `${Math.floor(t / 3600)} h${t % 3600 >= 60 ? ` ${Math.floor((t % 3600) / 60)} min` : ''}`;
  return `${Math.floor(t / 86400)} d${t % 86400 >= 3600 ? ` ${Math.floor((t % 86400) / 3600)} h` : ''}`;
}

/** The one pluraliser: count(1, 'node') -> "1 node", count(16384, 'rank') -> "16,384 ranks". */
export function count(n, one, many = `${one}s`) {
  return `${Number(n).toLocaleString()} ${noun(n, one, many)}`;
}

/** The word alone, for a count said elsewhere: noun(1, 'rank') -> "rank". */
export function noun(n, one, many = `${one}s`) {
  return Number(n) === 1 ? one : many;
}

export function stateBadge(state) {
  return h('span', { class: `badge s-${String(state || '').toLowerCase()}`, text: state || '?' });
}

/** [0,1,2,5,7,8] -> "0–2, 5, 7–8" */
export function ranges(nums) {
  const sorted = [...nums].sort((a, b) => a - b);
  const out = [];
  for (let i = 0; i < sorted.length; i++) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) j++;
    out.push(i === j ? `${sorted[i]}` : `${sorted[i]}–${sorted[j]}`);
    i = j;
  }
  return out.join(', ');
}

export function naturalCompare(a, b) {
  return String(a).localeCompare(String(b), undefined, { numeric: true });
}

export const TERMINAL = new Set(['SUCCEEDED', 'FAILED', 'CANCELLED']);

export function problemText(err) {
  if (err && err.problem) {
    const p = err.problem;
    return `${err.status} ${p.title || ''}: ${p.detail || p.code || ''}`.trim();
  }
  return String((err && err.message) || err);
}

/** A poller that runs fn now and every ms while the tab is visible; stop() ends it. */
export function poll(fn, ms) {
  let timer = null;
  let stopped = false;
  let running = false;
  const tick = async () => {
    if (stopped) return;
    if (!document.hidden && !running) {
      running = true;
      try { await fn(); } catch (e) { console.warn(e); } finally { running = false; }
    }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  tick();
  return { stop() { stopped = true; clearTimeout(timer); }, now() { clearTimeout(timer); tick(); } };
}
