// Job: spec, state, pending_reason, health, attempts with their node -> ranks
// map, the event timeline and logs (where the server has them), Resubmit and
// Cancel; its dependencies, and for an array its counts and the grid of its
// indexes by state (arrays.js); what its GPU time bought, its attempts as
// bars over time (timeline.js).
import { api, ApiError } from './api.js';
import { h, setText, stateBadge, time, clock, ranges, naturalCompare, poll, problemText, count, noun, TERMINAL } from './dom.js';
import { verdictLines, stackLine } from './verdict.js';
import { slowLines } from './ranks.js';
import { exitText, eventLabels, decisionText, attemptText, timeLeftText, priorityText, preemptingOf, jobIdParts, pendingWords } from './story.js';
import { createBody, newKey, shellLine, specPairs, retryPolicyText, limitsLines, DEFAULT_MAX_UNCOUNTED } from './spec.js';
import { countsText, arraySettingsText, childOf, dependenciesOf, waitingFor, IndexGrid, CELL_STATES,
  CELL_WORDS, NOT_MADE, cellTitle, tally } from './arrays.js';
import { LogFollower } from './logs.js';
import { timelineView } from './timeline.js';

const REFRESH_MS = 1500;
const SUBMIT_TRIES = 3;
/** refreshes of an ended array's page while its grid has not caught up with its counts */
const GRID_CATCH_UP = 10;
/** refreshes of an ended job's page while its logs have more pages to read */
const LOGS_CATCH_UP = 20;
/** a running attempt's bar grows: drawn again this often (ms), else only when the job changed */
const TIMELINE_MS = 5000;

function dl(pairs) {
  return h('dl', { class: 'facts' }, pairs.filter(([, v]) => v != null && v !== '')
    .map(([k, v]) => [h('dt', { text: k }), h('dd', {}, v)]));
}

function jobLink(id) {
  return h('a', { href: `#/jobs/${encodeURIComponent(id)}`, class: 'job-link', text: id });
}

/** Free text from the server with the jobs it names linked ("by job_X, priority class urgent"). */
function linked(text) {
  return jobIdParts(text).map((p) => (typeof p === 'string' ? p : jobLink(p.job)));
}

/** job_a, job_b as links, comma-separated. */
function jobLinks(ids) {
  return ids.map((id, i) => [i ? ', ' : '', jobLink(id)]);
}

/** 1st, 2nd, 3rd, 4th, 11th, 21st... */
function ordinal(n) {
  const suffix = n % 100 >= 11 && n % 100 <= 13 ? 'th' : ({ 1: 'st', 2: 'nd', 3: 'rd' })[n % 10] || 'th';
  return `${n}${suffix}`;
}

/** Jobs of the line as the CLI names them: yours as links with their GPUs,
 * another tenant's counted (the server gives no id for them). */
function lineJobs(items) {
  const named = items.filter((i) => i.job_id).map((i) => [jobLink(i.job_id), ` (${count(i.gpus, 'GPU')})`]);
  const others = items.filter((i) => !i.job_id).length;
  if (others) named.push(others === 1 ? '1 job of another tenant' : `${others} jobs of other tenants`);
  return named.map((part, i) => [i === 0 ? '' : i === named.length - 1 ? ' and ' : ', ', part]);
}

/** The "In line" fact: where a PENDING job stands in the placer's line (job.queue). */
function queueView(q) {
  if (!q) return null;
  const kind = q.gpu_type ? `${q.gpu_type} GPUs` : 'GPUs of any type';
  return h('span', { class: 'queue' }, [`${ordinal(q.position)} of ${q.of} for ${kind}`,
    q.ahead.length ? [', behind ', lineJobs(q.ahead)] : '']);
}

/** The "Estimated start" fact: the time (UTC, as every time here) and why, or why none. */
function queueStart(q) {
  if (!q) return null;
  return q.estimated_start ? `${time(q.estimated_start)} (${q.basis})` : q.basis;
}

/** The "Preempting" fact: the running jobs of lower classes a PENDING job waits for. */
function preemptingView(job) {
  const p = preemptingOf(job);
  if (!p) return null;
  return h('span', { class: 'preempting' }, p.jobs.length ? jobLinks(p.jobs) : 'jobs of lower classes',
    h('span', { class: 'muted', text: ` — of lower priority classes, preempted for this job (class ${p.cls || '?'}) at ${time(p.at)}: they stop (SIGTERM and their grace period), then requeue` }));
}

/** The "Depends on" fact: each dependency linked, what it must do, and whether it has. */
function dependenciesView(job) {
  const deps = dependenciesOf(job);
  if (!deps.length) return null;
  return h('ul', { class: 'plain deps' }, deps.map((d) => h('li', { dataset: { status: d.status } },
    jobLink(d.job), ` ${d.needs}`, h('span', { class: `dep-${d.status.replace(' ', '-')}`, text: ` — ${d.status}` }))));
}

/** The "Array" fact of an array's child: its index, of its parent (linked). */
function childView(job) {
  const c = childOf(job);
  if (!c) return null;
  return h('span', { class: 'array-child' }, `index ${c.index}${c.size ? ` of ${c.size}` : ''} in the array `, jobLink(c.parent));
}

/** The grid of an array's indexes: one cell per index, coloured by its state,
 * each made one a link to its page; a legend with how many cells are in each. */
function gridView(size) {
  const cells = [];
  const grid = h('div', { id: 'array-cells', class: `cells${size > 1000 ? ' dense' : ''}`, role: 'group', 'aria-label': 'Indexes by state' });
  for (let i = 0; i < size; i++) {
    const a = h('a', { class: `cell c-${NOT_MADE.toLowerCase()}`, dataset: { index: i, state: NOT_MADE },
      title: cellTitle(i, NOT_MADE), 'aria-label': cellTitle(i, NOT_MADE) });
    cells.push(a);
  }
  grid.append(...cells);
  const counts = {};
  const entries = {};
  const legend = h('ul', { class: 'legend', id: 'array-legend' }, CELL_STATES.map((s) => {
    counts[s] = h('span', { class: 'num', text: '0' });
    entries[s] = h('li', { dataset: { state: s }, hidden: true }, h('span', { class: `swatch cell c-${s.toLowerCase()}` }),
      h('span', {}, `${CELL_WORDS[s]} `, counts[s]));
    return entries[s];
  }));
  const status = h('p', { class: 'muted small', id: 'array-grid-status', role: 'status' });
  /** Show the loader's cells: only the ones that changed are touched. */
  function show(loaded, note) {
    loaded.forEach((c, i) => {
      const state = c ? c.state : NOT_MADE;
      const el = cells[i];
      if (el.dataset.state === state && (!c || el.dataset.id === (c.id || ''))) return;
      el.dataset.state = state;
      el.className = `cell c-${state.toLowerCase()}`;
      el.title = cellTitle(i, state, Boolean(c && c.never));
      el.setAttribute('aria-label', el.title);
      el.dataset.id = (c && c.id) || '';
      if (c && c.id) el.href = `#/jobs/${encodeURIComponent(c.id)}`;
    });
    const t = tally(loaded);
    for (const s of CELL_STATES) {
      setText(counts[s], t[s]);
      entries[s].hidden = !t[s];
    }
    setText(status, note);
    status.classList.remove('error');
  }
  function failed(text) {
    setText(status, text);
    status.classList.add('error');
  }
  return { el: h('div', {}, legend, grid, status), show, failed };
}

/** The stalled ranks as listed, or, when the record lists only its first
 * few (at most 64), the whole count first: "65,536 stalled (first: 0-63)". */
function stalledRanks(hl) {
  const listed = hl.stalled_ranks || [];
  if (!listed.length) return null;
  const count = hl.stalled_count;
  return typeof count === 'number' && count > listed.length
    ? `${count.toLocaleString('en-US')} stalled (first: ${ranges(listed)})` : ranges(listed);
}

/** Who went silent in what order, as evidence under the verdict (never a
 * second verdict): "2, then 0, 1 as long (within the jitter band)". */
export function silenceOrderText(hl) {
  if (hl.first_stalled_rank == null) return null;
  const co = (hl.co_first || []).map((c) => (typeof c === 'object' ? c.rank : c)).filter((r) => r !== hl.first_stalled_rank);
  return `${hl.first_stalled_rank} first${co.length ? `, then ${ranges(co)} as long (within the jitter band)` : ''}`
    + '; the rank heatmap lists every rank’s silence';
}

function healthFacts(hl) {
  if (!hl) return [];
  return [
    ['Health', hl.status],
    ['Stall threshold', hl.threshold_s != null ? `${hl.threshold_s} s` : null],
    ['Silence order (evidence)', silenceOrderText(hl)],
    ['Suspect node', hl.suspect_node],
    ['Stalled ranks', stalledRanks(hl)],
    ['Last heard', hl.last_heard_at ? time(hl.last_heard_at) : null],
    ['Detected', hl.detected_at ? time(hl.detected_at) : null],
  ];
}

/** The headline: the verdict's lines, its sentence in bold (empty while nothing is named). */
function verdictView(hl) {
  const v = (hl || {}).verdict;
  return v ? verdictLines(v).map(([k, t]) => h('p', { class: `v-${k}`, text: t })) : [];
}

export function nodeMap(placement) {
  const byNode = new Map();
  for (const p of placement || []) {
    if (!byNode.has(p.node_id)) byNode.set(p.node_id, []);
    byNode.get(p.node_id).push(p.rank);
  }
  return [...byNode.entries()].sort(([a], [b]) => naturalCompare(a, b));
}

function attemptsTable(attempts) {
  if (!attempts.length) return h('p', { class: 'muted', text: 'Not placed yet.' });
  return h('table', { class: 'attempts' },
    h('thead', {}, h('tr', {}, ['Attempt', 'State', 'Nodes → ranks', 'Created', 'Finished', 'Exit']
      .map((t) => h('th', { scope: 'col', text: t })))),
    h('tbody', {}, attempts.map((a) => h('tr', {},
      h('td', { class: 'num', text: a.attempt }), h('td', {}, stateBadge(a.state)),
      h('td', {}, h('ul', { class: 'nodemap' }, nodeMap(a.placement).map(([node, rs]) =>
        h('li', {}, h('code', { text: node }), ` → ${noun(rs.length, 'rank')} ${ranges(rs)}`)))),
      h('td', { text: time(a.created_at) }), h('td', { text: time(a.finished_at) }),
      h('td', {}, linked(exitText(a.exit)), decisionText(a.exit)
        ? h('span', { class: 'muted decision' }, ' — ', linked(decisionText(a.exit))) : null)))));
}

const pause = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

/** One click's create under one fresh key: an answer lost to the network, a
 * 5xx or 409 request_in_progress is asked again with the same key, which can
 * only answer the job that key made, never a second one. */
async function submitCopy(body) {
  const key = newKey();
  for (let i = 1; ; i++) {
    try { return await api.submit(body, key); } catch (e) {
      const again = !(e instanceof ApiError) || e.code === 'request_in_progress' || e.status >= 500;
      if (!again || i >= SUBMIT_TRIES) throw e;
      await pause(1000 * Math.min(5, e.retryAfter ?? 1));
    }
  }
}

function eventsList(events) {
  if (events == null) return h('p', { class: 'muted', text: 'This server has no event timeline (GET /v1/jobs/{id}/events).' });
  if (!events.length) return h('p', { class: 'muted', text: 'No events yet.' });
  return h('ol', { class: 'timeline' }, events.map((e) => {
    const more = eventLabels(e.type, e.extra);
    const jobs = e.type === 'preempting' && Array.isArray(e.extra.jobs) ? e.extra.jobs.map(String) : [];
    return h('li', {},
      h('time', { datetime: e.at || '', text: time(e.at) }), ' ', h('strong', { text: e.type }),
      e.detail ? [' — ', linked(e.detail)] : '', more.length ? h('span', { class: 'muted extra', text: ` (${more.join(' · ')})` }) : '',
      jobs.length ? h('p', { class: 'preempted' }, 'Jobs preempted: ', jobLinks(jobs)) : null,
      e.decision ? h('p', { class: 'decision' }, linked(e.decision)) : null,
      e.stacks.length ? h('ul', { class: 'stacks' }, e.stacks.map((s) => h('li', {}, h('code', { text: stackLine(s) })))) : null);
  }));
}

/** What an empty log says: why there is nothing (yet, or at all). */
function noOutputText(job) {
  if (!job || job.state === 'PENDING' || (job.state === 'SCHEDULED' && !job.started_at)) return 'No output yet: the job has not started.';
  if (TERMINAL.has(job.state)) return job.started_at ? 'The job wrote no output.' : 'No output: the job never started.';
  return 'No output yet.';
}

function logsView(follower, job) {
  const { lines } = follower;
  if (lines == null) return h('p', { class: 'muted', text: 'This server does not serve logs (GET /v1/jobs/{id}/logs).' });
  if (!lines.length) return h('p', { class: 'muted', text: noOutputText(job) });
  return [
    follower.dropped ? h('p', { class: 'muted small', text: `The newest ${lines.length.toLocaleString()} lines; \`gpujobs logs\` prints every one.` }) : null,
    h('pre', { class: 'logs', tabindex: 0 }, lines.map((l) =>
      `${l.rank != null ? `[${l.rank}${l.stream ? ` ${l.stream}` : ''}] ` : ''}${l.text}\n`).join('')),
  ].filter(Boolean);
}

export function mount(main, [jobId]) {
  document.title = `${jobId} · gpujobs`;
  const title = h('h1', { id: 'job-title', tabindex: -1, text: jobId });
  const badge = h('span', { id: 'job-state' });
  // disabled until the job is loaded; hidden for good when there is no such job
  const cancelBtn = h('button', { type: 'button', id: 'cancel', class: 'danger', text: 'Cancel job…', disabled: true, hidden: true });
  const cancelStatus = h('p', { id: 'cancel-status', role: 'status', class: 'notice', hidden: true });
  const resubmitBtn = h('button', { type: 'button', id: 'resubmit', text: 'Resubmit', disabled: true, hidden: true,
    title: 'Submit this job’s spec again, as a new job' });
  const resubmitStatus = h('p', { id: 'resubmit-status', class: 'error', role: 'alert' });
  const headline = h('div', { id: 'job-verdict', class: 'summary', role: 'status', hidden: true });
  const facts = h('section', { id: 'facts' });
  const spec = h('section', { id: 'spec' });
  const attempts = h('section', { id: 'attempts' });
  const timelineHead = h('h2', { text: 'Timeline', hidden: true });
  const timeline = h('section', { id: 'timeline', hidden: true });
  const gridHead = h('h2', { text: 'Indexes', hidden: true });
  const gridSection = h('section', { id: 'array-grid', hidden: true });
  const events = h('section', { id: 'events' });
  const logs = h('section', { id: 'logs' });
  const logsHead = h('h2', { text: 'Logs' });
  const error = h('p', { class: 'error', role: 'alert' });
  const reason = h('input', { id: 'cancel-reason', type: 'text', maxlength: 256, placeholder: 'optional' });
  const dialog = h('dialog', { id: 'cancel-dialog', 'aria-labelledby': 'cancel-dialog-title' },
    h('form', { method: 'dialog' },
      h('h2', { id: 'cancel-dialog-title', text: 'Cancel this job?' }),
      h('p', { id: 'cancel-dialog-text' }),
      h('label', { for: 'cancel-reason', text: 'Reason' }), reason,
      h('div', { class: 'buttons' },
        h('button', { value: 'keep', text: 'Keep it running' }),
        h('button', { value: 'cancel', id: 'confirm-cancel', class: 'danger', text: 'Cancel job' }))));
  let job = null;
  let grid = null; // an array's: {loader, view}
  let catchUp = GRID_CATCH_UP;
  let logsCatchUp = LOGS_CATCH_UP;
  // the latest lines once, then only what is new (logs.js)
  const follower = new LogFollower((query) => api.logs(jobId, query));
  let logsShown = -1;
  let submitting = false; // a Resubmit in flight: the button stays disabled
  let mounted = true; // a Resubmit answered after the page was left does not navigate
  const seen = {};

  // shown once the job is read: a job that is not there gets its message alone,
  // no empty sections and no button that could not apply
  const ranksLink = h('a', { id: 'ranks-link', class: 'button', href: `#/jobs/${encodeURIComponent(jobId)}/ranks`, text: 'Rank heatmap', hidden: true });
  const body = h('div', { id: 'job-body', hidden: true },
    h('div', { class: 'toolbar' }, ranksLink, resubmitBtn, cancelBtn),
    resubmitStatus, cancelStatus, headline, facts, gridHead, gridSection, timelineHead, timeline,
    h('h2', { text: 'Attempts' }), attempts,
    h('h2', { text: 'Events' }), events,
    logsHead, logs,
    h('h2', { text: 'Spec' }), spec, dialog);
  main.append(
    h('p', { class: 'crumbs' }, h('a', { href: '#/jobs', text: '← Jobs' })),
    h('div', { class: 'title-row' }, title, badge), error, body);
  title.focus();

  resubmitBtn.addEventListener('click', async () => {
    if (submitting || !job) return;
    submitting = true; // before any await: a second click finds the button disabled
    resubmitBtn.disabled = true;
    setText(resubmitBtn, 'Resubmitting…');
    resubmitStatus.textContent = '';
    try {
      const res = await submitCopy(createBody(job.spec));
      if (mounted) location.hash = `#/jobs/${encodeURIComponent(res.data.id)}`;
    } catch (e) {
      setText(resubmitStatus, `Resubmit refused: ${problemText(e)}`);
      setText(resubmitBtn, 'Resubmit');
      submitting = false;
      resubmitBtn.disabled = false;
    }
  });

  cancelBtn.addEventListener('click', () => {
    setText(dialog.querySelector('#cancel-dialog-text'), job && job.array
      ? `“${job.name || job.id}” is ${job.state}, an array of ${count(job.array.size, 'index', 'indexes')}. Every index not ended is cancelled (the agents stop its ranks: SIGTERM, then SIGKILL after a grace period) and none is started any more; the array becomes CANCELLED when all have ended.`
      : `“${job ? job.name || job.id : jobId}” is ${job ? job.state : '?'}. The agents stop its ranks (SIGTERM, then SIGKILL after a grace period); the job becomes CANCELLED when they confirm.`);
    reason.value = '';
    dialog.returnValue = '';
    dialog.showModal();
  });
  dialog.addEventListener('close', async () => {
    if (dialog.returnValue !== 'cancel') return;
    cancelBtn.disabled = true;
    try {
      const res = await api.cancel(jobId, reason.value.trim());
      cancelStatus.hidden = false;
      setText(cancelStatus, `${res.status} Accepted: cancel requested at ${time(res.data.cancel_requested_at)}; state ${res.data.state}. Waiting for the agents to confirm…`);
      update(res.data);
      poller.now();
    } catch (e) {
      cancelStatus.hidden = false;
      setText(cancelStatus, `Cancel refused: ${problemText(e)}`);
      cancelBtn.disabled = false;
    }
  });

  function changed(key, value) {
    const s = JSON.stringify(value);
    if (seen[key] === s) return false;
    seen[key] = s;
    return true;
  }

  function update(j) {
    job = j;
    document.title = `${j.name || j.id} · gpujobs`;
    setText(title, j.name || j.id);
    if (changed('state', j.state)) badge.replaceChildren(stateBadge(j.state));
    // Cancel only while there is something to cancel; Resubmit applies to any job
    cancelBtn.disabled = TERMINAL.has(j.state) || !!j.cancel_requested_at;
    cancelBtn.hidden = cancelBtn.disabled;
    resubmitBtn.disabled = submitting;
    resubmitBtn.hidden = false;
    // the heatmap once there are ranks: an attempt was placed; an array has none of its own
    ranksLink.hidden = !!j.array || !(j.attempt > 0);
    body.hidden = false;
    if (!cancelStatus.hidden && TERMINAL.has(j.state)) setText(cancelStatus, `Cancel requested at ${time(j.cancel_requested_at)}; the job is now ${j.state}.`);
    if (changed('verdict', [(j.health || {}).verdict, slowLines(j)])) {
      // the verdict, then each slow rank's sentence
      headline.replaceChildren(...verdictView(j.health),
        ...slowLines(j).map((t) => h('p', { class: 'v-slow', text: t })));
      headline.hidden = !headline.childElementCount;
    }
    const left = timeLeftText(j); // changes as time passes: part of what the facts say
    if (changed('facts', [j, left])) {
      const waitedTooLong = (j.exit || {}).reason === 'pending_timeout';
      const limits = limitsLines(j.spec);
      const cap = (j.spec.retry || {}).max_uncounted_retries ?? DEFAULT_MAX_UNCOUNTED;
      const waiting = waitingFor(j);
      facts.replaceChildren(dl([
        ['ID', h('code', { text: j.id })], ['State', j.state],
        ['Why pending', (j.state === 'PENDING' || waitedTooLong) && j.pending_reason ? h('span', {}, linked(pendingWords(j.pending_reason))) : null],
        ['Waiting for', waiting.length ? h('span', { class: 'waiting-for' }, jobLinks(waiting)) : null],
        ['In line', j.state === 'PENDING' ? queueView(j.queue) : null],
        ['GPUs held by', j.state === 'PENDING' && j.queue?.waiting_for.length ? h('span', {}, lineJobs(j.queue.waiting_for)) : null],
        ['Estimated start', j.state === 'PENDING' ? queueStart(j.queue) : null],
        ['Depends on', dependenciesView(j)],
        ['Array', j.array ? arraySettingsText(j.spec.array, j.array) : childView(j)],
        ['Progress', j.array ? h('span', { id: 'array-counts' }, countsText(j.array)) : null],
        ['Preempting', preemptingView(j)],
        ['Attempt', j.array ? null : attemptText(j)],
        ['Uncounted retries', j.uncounted_retries ? `${j.uncounted_retries} of at most ${cap}` : null],
        ['Retry policy', `${retryPolicyText(j.spec)}${j.array ? ', for each index on its own' : ''}`],
        ['Time limits', limits.length ? h('ul', { class: 'plain' }, limits.map((t) => h('li', { text: t }))) : null],
        ['Time left', left],
        ['Priority', priorityText(j.spec)],
        ['Ranks', `${count(j.spec.ranks, 'rank')} × ${count(j.spec.gpus_per_rank ?? 1, 'GPU')} (${j.spec.gpu_type || 'any type'})${j.array ? ' per index' : ''}`],
        ['Command', h('code', { text: shellLine(j.spec.command) })],
        ['Working dir', j.spec.working_dir && h('code', { text: j.spec.working_dir })],
        ['Checkpoints', j.spec.checkpoint_dir && h('span', {},
          h('code', { text: `${j.spec.checkpoint_dir.replace(/\/+$/, '')}/${j.id}` }),
          h('span', { class: 'muted', text: ' (GPUJOBS_CHECKPOINT_DIR)' }))],
        ['Labels', Object.entries(j.spec.labels || {}).map(([k, v]) => `${k}=${v}`).join(', ')],
        ['Created', time(j.created_at)], ['Started', j.started_at && time(j.started_at)],
        ['Finished', j.finished_at && time(j.finished_at)],
        ['Cancel requested', j.cancel_requested_at && time(j.cancel_requested_at)], ['Cancel reason', j.cancel_reason],
        ['Exit', j.exit ? h('span', {}, linked(exitText(j.exit))) : null],
        ['Retry decision', decisionText(j.exit) ? h('span', {}, linked(decisionText(j.exit))) : null],
        ...(j.array ? [] : healthFacts(j.health)), // an array never runs itself: its indexes have health
      ]));
      spec.replaceChildren(
        h('p', { class: 'muted small', text: 'Command, ranks, GPUs, priority class, working dir, labels, retry policy, time limits, checkpoints, dependencies and array: above. Resubmit sends all of it again.' }),
        dl(specPairs(j.spec)));
    }
  }

  async function refresh() {
    try {
      // an array runs nothing itself: it has no logs to follow (its indexes do)
      const [j, a, ev] = await Promise.all([api.job(jobId), api.attempts(jobId),
        api.events(jobId).catch(() => null), job && job.array ? false : follower.refresh().catch(() => false)]);
      error.textContent = '';
      update(j);
      if (changed('attempts', a.attempts)) {
        attempts.replaceChildren(j.array && !a.attempts.length
          ? h('p', { class: 'muted', text: 'An array does not run itself: each of its indexes is a job of its own, with its own attempts (Indexes above).' })
          : attemptsTable(a.attempts));
      }
      if (changed('events', ev)) events.replaceChildren(eventsList(ev));
      // an array holds no GPUs itself: its indexes do, each on its own page
      timelineHead.hidden = timeline.hidden = !!j.array;
      // a running job's usage grows with every read: drawn with the bars' own tick, not each read
      const ended = TERMINAL.has(j.state);
      if (!j.array && changed('timeline', [j.state, j.spec, a.attempts, ev,
        ended ? j.usage : Math.floor(Date.now() / TIMELINE_MS)])) {
        timeline.replaceChildren(timelineView(j, a.attempts, ev));
      }
      logsHead.hidden = logs.hidden = !!j.array;
      if (!j.array && (logsShown !== follower.version || changed('logs-state', [j.state, !!j.started_at]))) {
        logsShown = follower.version;
        logs.replaceChildren(...[logsView(follower, j)].flat());
      }
      if (j.array) await refreshGrid(j);
      const gridDone = !grid || grid.loader.settled(j) || catchUp <= 0;
      if (TERMINAL.has(j.state) && seen.final && follower.behind) logsCatchUp--;
      const logsDone = !follower.behind || logsCatchUp <= 0;
      if (TERMINAL.has(j.state) && seen.final && gridDone && logsDone) poller.stop();
      seen.final = TERMINAL.has(j.state);
    } catch (e) {
      if (e.status === 404) {
        // nothing to show, cancel or poll for: a job id is never reused
        cancelBtn.disabled = true;
        resubmitBtn.disabled = true;
        body.hidden = true;
        body.remove();
        setText(title, 'No such job');
        document.title = 'No such job · gpujobs';
        poller.stop();
      }
      setText(error, e.status === 404 ? `No job ${jobId} (or it belongs to another tenant).` : `Could not load the job: ${problemText(e)}`);
    }
  }
  /** The array's grid: its children asked for only when they may have changed
   * (IndexGrid), within this page's refresh, never more often. */
  async function refreshGrid(j) {
    if (!grid) {
      const view = gridView(j.array.size);
      grid = { view, loader: new IndexGrid(j.array.size, (token) => api.children(jobId, { pageToken: token })) };
      gridSection.replaceChildren(view.el);
      gridHead.hidden = false;
      gridSection.hidden = false;
    }
    if (TERMINAL.has(j.state) && seen.final) catchUp--;
    try {
      if (!(await grid.loader.refresh(j))) return;
    } catch (e) { // the job itself was read: this is the grid's problem alone
      grid.view.failed(`Could not list the indexes: ${problemText(e)}`);
      return;
    }
    const made = grid.loader.cells.filter(Boolean).length;
    const so = made < j.array.size ? `, ${made.toLocaleString()} made so far` : '';
    grid.view.show(grid.loader.cells, `${count(j.array.size, 'index', 'indexes')}${so}; each cell links to its index’s job. Updated ${clock()}.`);
  }

  const poller = poll(refresh, REFRESH_MS);
  return () => { mounted = false; poller.stop(); };
}
