// Pipelines and sweeps (issue 27) as a person reads them: a job's
// dependencies and what it still waits for, an array child's place in its
// array, an array's counts by state, and the grid of its indexes with the
// loader that keeps it current at little cost. Pure (the loader is given
// the API's list call), so it runs under node too.
import { count } from './dom.js';

/** What a grid cell of an index not made yet says: pending, not started. */
export const NOT_MADE = 'NOT_MADE';
/** The states a grid cell shows, in the legend's order. */
export const CELL_STATES = [NOT_MADE, 'PENDING', 'SCHEDULED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED'];
export const CELL_WORDS = {
  [NOT_MADE]: 'not started yet', PENDING: 'pending', SCHEDULED: 'scheduled', RUNNING: 'running',
  SUCCEEDED: 'succeeded', FAILED: 'failed', CANCELLED: 'cancelled',
};
const ENDS = ['SUCCEEDED', 'FAILED', 'CANCELLED'];
const ENDED = new Set(ENDS);

const n = (counts, state) => Number((counts || {})[state] || 0);

/** The indexes ended, of an array's `array` member. */
export function doneOf(array) {
  return ENDS.reduce((sum, s) => sum + n(array.counts, s), 0);
}

/** An array's counts (its `array` member): "3 of 6 indexes done: 2 succeeded,
 * 1 failed; 2 scheduled or running, 1 pending". PENDING includes the indexes
 * not made yet, RUNNING the scheduled ones (the server counts them so). */
export function countsText(array) {
  const c = array.counts || {};
  const ends = ENDS.filter((s) => n(c, s)).map((s) => `${n(c, s)} ${s.toLowerCase()}`);
  const open = [n(c, 'RUNNING') && `${n(c, 'RUNNING')} scheduled or running`,
    n(c, 'PENDING') && `${n(c, 'PENDING')} pending`].filter(Boolean);
  let text = `${doneOf(array)} of ${count(array.size, 'index', 'indexes')} done`;
  if (ends.length) text += `: ${ends.join(', ')}`;
  if (open.length) text += `; ${open.join(', ')}`;
  return text;
}

/** The jobs list's word for an array parent: "array 7/20 done", and how many failed. */
export function listText(array) {
  const failed = n(array.counts, 'FAILED');
  return `array ${doneOf(array)}/${array.size} done${failed ? `, ${failed} failed` : ''}`;
}

/** An array's settings (spec.array) and how far it got (its `array` member):
 * "6 indexes, at most 2 at once, failing once more than 1 fails; 4 made so
 * far; env by index: SEED (values not shown)". */
export function arraySettingsText(specArray, array) {
  const a = specArray || {};
  const size = a.size ?? (array && array.size);
  const parts = [count(size, 'index', 'indexes')];
  if (a.max_parallel != null && a.max_parallel < size) parts.push(`at most ${a.max_parallel} at once`);
  if (a.max_failed_indexes === 0) parts.push('the array fails at the first index that fails');
  else if (a.max_failed_indexes != null) {
    parts.push(`the array fails once more than ${count(a.max_failed_indexes, 'index', 'indexes')} ${a.max_failed_indexes === 1 ? 'fails' : 'fail'}`);
  }
  let text = parts.join(', ');
  if (array && array.materialized < size) text += `; ${Number(array.materialized).toLocaleString()} made so far`;
  const env = Object.keys(a.env || {}).sort();
  if (env.length) text += `; env by index: ${env.join(', ')} (values are not shown)`;
  return text;
}

/** An array child's place: {parent, index, size} (size from its env, null if
 * not there); null for any other job. */
export function childOf(job) {
  if (!job || job.parent_id == null) return null;
  const size = Number((((job.spec || {}).env) || {}).GPUJOBS_ARRAY_SIZE);
  return { parent: job.parent_id, index: job.array_index, size: Number.isInteger(size) && size > 0 ? size : null };
}

const NEEDS = {
  succeeded: 'to succeed',
  failed: 'to fail (FAILED or CANCELLED)',
  ended: 'to end, however it ends',
};

/** A job's dependencies (spec.depends_on), each {job, condition, needs,
 * status}: status 'waiting' (not ended yet), 'met', 'never met' (it ended the
 * wrong way: this job ended dependency_failed naming it) or 'not met' (this
 * job ended while it waited). */
export function dependenciesOf(job) {
  const deps = ((job && job.spec) || {}).depends_on || [];
  const waiting = new Set(job.waiting_for || []);
  const failed = job.exit && job.exit.reason === 'dependency_failed' ? job.exit.dependency : null;
  return deps.map((d) => {
    const condition = d.condition || 'succeeded';
    let status = 'met';
    if (d.job_id === failed) status = 'never met';
    else if (waiting.has(d.job_id)) status = job.state === 'PENDING' ? 'waiting' : 'not met';
    return { job: d.job_id, condition, needs: NEEDS[condition] || `to ${condition}`, status };
  });
}

/** The jobs a PENDING job still waits for (waiting_for), else []. */
export function waitingFor(job) {
  return job && job.state === 'PENDING' && Array.isArray(job.waiting_for) ? job.waiting_for.map(String) : [];
}

// -- the grid -----------------------------------------------------------------
/** What a cell says on hover: "index 3: running", "index 5: not started yet (pending)". */
export function cellTitle(index, state, never = false) {
  if (never) return `index ${index}: never started (cancelled)`;
  return state === NOT_MADE ? `index ${index}: not started yet (pending)` : `index ${index}: ${CELL_WORDS[state] || state}`;
}

/** How many cells are in each state (CELL_STATES). */
export function tally(cells) {
  const out = Object.fromEntries(CELL_STATES.map((s) => [s, 0]));
  for (const c of cells) out[c ? c.state : NOT_MADE] = (out[c ? c.state : NOT_MADE] || 0) + 1;
  return out;
}

/** Whether the cells say what the parent's counts say (RUNNING: scheduled or
 * running; PENDING: pending or not made yet). */
export function agrees(array, cells) {
  const t = tally(cells);
  const c = array.counts || {};
  return t.SCHEDULED + t.RUNNING === n(c, 'RUNNING') && t.PENDING + t[NOT_MADE] === n(c, 'PENDING')
    && ENDS.every((s) => t[s] === n(c, s));
}

/** An array's indexes by state, from its children (GET /v1/jobs?parent=),
 * asked again only when it may have changed: when the parent's state or
 * counts moved since the cells last agreed with them, or a cell is SCHEDULED
 * (it starts running without the counts moving). Children are listed in index
 * order and an ended child never changes, so a refresh starts at the first
 * page holding an index not ended (its page token kept from the walk before),
 * not at the first page. list(pageToken) answers one page of children. */
export class IndexGrid {
  constructor(size, list) {
    this.size = size;
    this.list = list;
    this.cells = new Array(size).fill(null); // index -> {id, state}, null: not made yet
    this.pages = []; // the last walk's pages: {token, first, last} (indexes)
    this.agreedOn = null; // the parent's state and counts the cells last agreed with
    this.requests = 0;
  }

  keyOf(parent) { return JSON.stringify([parent.state, parent.array]); }

  /** Whether refresh(parent) would ask the server. */
  due(parent) { return this.keyOf(parent) !== this.agreedOn; }

  /** Whether the cells say the parent's final counts: nothing more to ask. */
  settled(parent) { return ENDED.has(parent.state) && !this.due(parent); }

  /** Ask for the children that may have changed; true when it asked. */
  async refresh(parent) {
    const key = this.keyOf(parent);
    if (key === this.agreedOn) return false;
    const open = (pg) => {
      for (let i = pg.first; i <= pg.last; i++) if (!this.cells[i] || !ENDED.has(this.cells[i].state)) return true;
      return false;
    };
    let from = this.pages.findIndex(open);
    if (from < 0) from = Math.max(0, this.pages.length - 1); // only what was made since
    let token = this.pages.length ? this.pages[from].token : null;
    const pages = this.pages.slice(0, from);
    for (;;) {
      this.requests++;
      const data = await this.list(token);
      const jobs = (data && data.jobs) || [];
      let first = null; let last = null;
      for (const j of jobs) {
        const i = j.array_index;
        if (!Number.isInteger(i) || i < 0 || i >= this.size) continue;
        this.cells[i] = { id: j.id, state: j.state };
        if (first == null) first = i;
        last = i;
      }
      if (first != null) pages.push({ token, first, last });
      token = data && data.next_page_token;
      if (!token) break;
    }
    this.pages = pages;
    if (ENDED.has(parent.state)) { // ended early: the indexes never made are cancelled (as counted)
      for (let i = 0; i < this.size; i++) if (!this.cells[i]) this.cells[i] = { id: null, state: 'CANCELLED', never: true };
    }
    const scheduled = this.cells.some((c) => c && c.state === 'SCHEDULED');
    this.agreedOn = !scheduled && agrees(parent.array, this.cells) ? key : null;
    return true;
  }
}
