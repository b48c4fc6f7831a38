// Jobs: a table with a state filter, a search over the page shown, cursor
// paging with the API's page tokens, and a live refresh that updates rows in
// place (no re-render, no flicker).
import { api } from './api.js';
import { h, setText, stateBadge, ago, time, clock, poll, problemText, duration, count, TERMINAL } from './dom.js';
import { verdictOf, shorten } from './verdict.js';
import { exitText, decisionText, attemptText, pendingWords } from './story.js';
import { listText, countsText } from './arrays.js';

const STATES = ['PENDING', 'SCHEDULED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED'];
const PAGE_SIZE = 25;
const REFRESH_MS = 2000;
const DETAIL_CHARS = 600;
/** The table's columns: a stalled job's verdict is a line under its row, across all of them. */
const COLUMNS = ['Name and ID', 'State', 'Ranks × GPUs', 'Attempt', 'Duration', 'Reason', 'Labels', 'Created (UTC)'];

function labelsText(labels) {
  return Object.entries(labels || {}).map(([k, v]) => `${k}=${v}`).join(' ');
}

/** name, id or any label (key, value or key=value) contains every word of q */
export function matches(job, q) {
  const words = q.toLowerCase().split(/\s+/).filter(Boolean);
  if (!words.length) return true;
  const hay = [job.name || '', job.id, labelsText(job.spec && job.spec.labels)].join(' ').toLowerCase();
  return words.every((w) => hay.includes(w));
}

function healthText(job) {
  const hl = job.health || {};
  return hl.status && hl.status !== 'UNKNOWN' ? hl.status.toLowerCase() : '';
}

/** The line under a stalled job's row: the server's verdict, whole (it wraps
 * across the table's width), or that no rank is named yet; '' for any other job. */
function detailText(job) {
  const v = verdictOf(job);
  if (v) return shorten(v.text, DETAIL_CHARS);
  return (job.health || {}).status === 'STALLED' ? 'Stalled: the server names no rank that stopped yet.' : '';
}

/** Why it waits (PENDING) or how it ended (its exit, and the cancel's reason, or why
 * it waited too long). */
export function reasonText(job) {
  if (job.state === 'PENDING') return job.pending_reason || '';
  const ended = exitText(job.exit);
  if (!ended) return '';
  if (job.exit.reason === 'pending_timeout' && job.pending_reason) return `${ended}: ${job.pending_reason}`;
  return job.cancel_reason && job.exit.reason === 'cancelled' ? `${ended}: ${job.cancel_reason}` : ended;
}

/** started -> finished, or -> now while it runs; '—' before it starts. */
export function durationText(job, now = Date.now()) {
  if (!job.started_at) return '—';
  const end = job.finished_at ? new Date(job.finished_at).getTime() : now;
  return duration((end - new Date(job.started_at).getTime()) / 1000);
}

/** "4 ranks × 2 GPUs": the ranks and each one's GPUs, with the type asked for
 * on a line of its own ('any type' when none was). */
function gpusText(spec) {
  const ranks = spec.ranks ?? 1; const each = spec.gpus_per_rank ?? 1;
  return `${count(ranks, 'rank')} × ${count(each, 'GPU')}`;
}

function gpusTitle(spec) {
  const ranks = spec.ranks ?? 1; const each = spec.gpus_per_rank ?? 1;
  return `${count(ranks * each, 'GPU')} in all: ${count(ranks, 'rank')} × ${count(each, 'GPU')} each, ${spec.gpu_type ? `type ${spec.gpu_type}` : 'any type'}`;
}

function newRow(job) {
  const tr = h('tr', { dataset: { id: job.id } });
  tr.cells_ = {
    name: h('a', { href: `#/jobs/${encodeURIComponent(job.id)}`, class: 'job-link' }),
    progress: h('span', { class: 'array-progress' }), // an array's: "array 7/20 done"
    id: h('code', { class: 'job-id' }), badge: h('span'), health: h('span', { class: 'health' }),
    cancel: h('span', { class: 'cancel-note', text: 'cancel requested' }),
    gpus: h('span'), type: h('span', { class: 'gpu-type' }),
    attempt: h('td', { class: 'num' }), duration: h('td', { class: 'num duration' }),
    reason: h('td', { class: 'reason' }), date: h('span'), clock: h('span'),
    labels: h('td', { class: 'labels' }),
  };
  const c = tr.cells_;
  tr.append(h('td', { class: 'name' }, c.name, c.progress, c.id),
    h('td', { class: 'state' }, c.badge, c.health, c.cancel),
    h('td', { class: 'gpus' }, c.gpus, c.type), c.attempt,
    c.duration, c.reason, c.labels, h('td', { class: 'created' }, c.date, c.clock));
  c.created = tr.lastChild;
  return tr;
}

/** The line under a row, across every column: a stalled job's verdict. */
function newDetail(job) {
  const text = h('span', { class: 'verdict' });
  const tr = h('tr', { class: 'detail stalled', dataset: { detailOf: job.id } },
    h('td', { colspan: COLUMNS.length, class: 'note' },
      h('span', { class: 'verdict-label', text: 'Verdict: ' }), text, ' ',
      h('a', { href: `#/jobs/${encodeURIComponent(job.id)}/ranks`, class: 'ranks-link', text: 'rank heatmap' })));
  tr.text_ = text;
  return tr;
}

function fillRow(tr, job) {
  const c = tr.cells_;
  setText(c.name, job.name || '(no name)');
  setText(c.progress, job.array ? listText(job.array) : '');
  c.progress.title = job.array ? countsText(job.array) : '';
  c.progress.hidden = !job.array;
  setText(c.id, job.id);
  if (c.badge.dataset.state !== job.state) {
    c.badge.dataset.state = job.state;
    c.badge.replaceChildren(stateBadge(job.state));
  }
  const spec = job.spec || {};
  setText(c.gpus, gpusText(spec));
  setText(c.type, spec.gpu_type || 'any type');
  c.gpus.parentNode.title = gpusTitle(spec);
  setText(c.duration, durationText(job));
  c.duration.title = job.started_at ? `${time(job.started_at)} → ${job.finished_at ? time(job.finished_at) : 'now'}` : 'not started';
  setText(c.reason, pendingWords(reasonText(job)));
  c.reason.title = decisionText(job.exit) || ''; // what the retry rules decided, on hover
  setText(c.attempt, job.attempt);
  c.attempt.title = job.spec ? `attempt ${attemptText(job)}` : '';
  const health = healthText(job);
  setText(c.health, health ? `health ${health}` : '');
  c.health.hidden = !health;
  c.health.classList.toggle('bad', health === 'stalled');
  c.cancel.hidden = !(job.cancel_requested_at && !TERMINAL.has(job.state));
  setText(c.labels, labelsText(job.spec && job.spec.labels));
  const created = time(job.created_at); // "2026-12-07 17:19:16 UTC": the date, then the time
  setText(c.date, created.split(' ')[0]);
  setText(c.clock, created.split(' ').slice(1).join(' '));
  c.created.title = job.created_at ? ago(job.created_at) : '';
  const stalled = (job.health || {}).status === 'STALLED';
  tr.classList.toggle('stalled', stalled);
  const detail = detailText(job);
  if (detail && !tr.detail_) tr.detail_ = newDetail(job);
  if (!detail && tr.detail_) { tr.detail_.remove(); tr.detail_ = null; }
  if (tr.detail_) {
    setText(tr.detail_.text_, detail);
    tr.detail_.text_.title = (verdictOf(job) || {}).text || ''; // the whole sentence, if it was shortened
  }
}

export function mount(main, _params, hash) {
  document.title = 'Jobs · gpujobs';
  const query = new URLSearchParams((hash.split('?')[1]) || '');
  const view = { state: STATES.includes(query.get('state')) ? query.get('state') : '', q: query.get('q') || '', tokens: [null], page: 0 };
  const rows = new Map();
  let jobs = [];
  let next = null;

  const stateSel = h('select', { id: 'state-filter', onchange: () => { view.state = stateSel.value; restart(); } },
    h('option', { value: '', text: 'All states' }), STATES.map((s) => h('option', { value: s, text: s })));
  stateSel.value = view.state;
  const search = h('input', { id: 'search', type: 'search', placeholder: 'name, id or label (team=nlp)', value: view.q,
    oninput: () => { view.q = search.value; remember(); render(); } });
  const live = h('input', { id: 'live', type: 'checkbox', checked: true, onchange: () => (live.checked ? poller.now() : null) });
  const status = h('span', { class: 'muted', role: 'status', id: 'jobs-status' });
  const tbody = h('tbody', { id: 'jobs-body' });
  const empty = h('p', { class: 'muted', id: 'jobs-empty', hidden: true });
  const prev = h('button', { type: 'button', id: 'newer', onclick: () => { view.page--; load(); }, text: '← Newer' });
  const nextBtn = h('button', { type: 'button', id: 'older', onclick: () => { view.tokens[view.page + 1] = next; view.page++; load(); }, text: 'Older →' });
  const pageNo = h('span', { class: 'muted', id: 'page-no' });

  main.append(
    h('h1', { text: 'Jobs' }),
    h('div', { class: 'toolbar' },
      h('label', { for: 'state-filter', text: 'State' }), stateSel,
      h('label', { for: 'search', text: 'Search' }), search,
      h('label', { class: 'inline' }, live, ' Live'), status),
    h('div', { class: 'table-wrap' }, h('table', { class: 'jobs' },
      h('caption', { class: 'sr-only', text: 'Jobs, newest first' }),
      h('thead', {}, h('tr', {}, COLUMNS.map((t) => h('th', { scope: 'col', text: t })))),
      tbody)),
    empty,
    h('div', { class: 'pager' }, prev, pageNo, nextBtn));

  function remember() {
    const p = new URLSearchParams();
    if (view.state) p.set('state', view.state);
    if (view.q) p.set('q', view.q);
    const s = p.toString();
    history.replaceState(null, '', `#/jobs${s ? `?${s}` : ''}`);
  }

  function render() {
    const shown = jobs.filter((j) => matches(j, view.q));
    const keep = new Set(shown.map((j) => j.id));
    for (const [id, tr] of rows) {
      if (!keep.has(id)) { tr.remove(); if (tr.detail_) tr.detail_.remove(); rows.delete(id); }
    }
    let cursor = tbody.firstChild; // rows already in place are never moved
    for (const job of shown) {
      let tr = rows.get(job.id);
      if (!tr) { tr = newRow(job); rows.set(job.id, tr); }
      fillRow(tr, job);
      for (const el of [tr, tr.detail_]) { // the row, then its verdict line under it
        if (!el) continue;
        if (el === cursor) cursor = cursor.nextSibling;
        else tbody.insertBefore(el, cursor);
      }
    }
    empty.hidden = shown.length > 0;
    setText(empty, jobs.length ? `None of the ${jobs.length} jobs on this page match “${view.q}”.` : 'No jobs here yet.');
    prev.disabled = view.page === 0;
    nextBtn.disabled = !next;
    setText(pageNo, `page ${view.page + 1}`);
  }

  let generation = 0;
  async function load() {
    const mine = ++generation;
    try {
      const data = await api.listJobs({ state: view.state, pageSize: PAGE_SIZE, pageToken: view.tokens[view.page] });
      if (mine !== generation) return; // a newer request (filter, page) won
      jobs = data.jobs;
      next = data.next_page_token;
      render();
      setText(status, `updated ${clock()}`);
      status.classList.remove('error');
    } catch (e) {
      if (mine !== generation) return;
      setText(status, `refresh failed: ${problemText(e)}`);
      status.classList.add('error');
    }
  }

  function restart() {
    view.tokens = [null]; view.page = 0; remember();
    load();
  }

  render();
  const poller = poll(async () => { if (live.checked) await load(); }, REFRESH_MS);
  return () => { generation++; poller.stop(); };
}
