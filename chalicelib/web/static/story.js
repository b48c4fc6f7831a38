// The API's records as a person reads them: an exit as a sentence, an event's
// details as short labels. Nothing the dashboard prints is JSON (the Spec
// section excepted: it is the document the job was submitted with).
import { count, noun, ranges, duration } from './dom.js';

/** {"reason":"rank_failed","exit_code":1,"rank":3,"node_id":"node-2"} ->
 * "rank_failed: rank 3 on node-2 exited with code 1"; a preemption's detail said as
 * it is: "preempted: node n1 drained: bad ECC" (its decision: decisionText). */
export function exitText(exit) {
  if (!exit) return null;
  const { reason, exit_code: code, rank, node_id: node, decision, detail, ...rest } = exit;
  // dependency_failed names its dependency in the detail too: "job_X ended FAILED; …"
  if (rest.dependency != null && detail && String(detail).includes(rest.dependency)) delete rest.dependency;
  const who = rank != null ? `rank ${rank}${node ? ` on ${node}` : ''}` : (node ? `on ${node}` : null);
  let what = null;
  if (reason === 'node_lost') what = rank != null ? `rank ${rank}'s node${node ? ` ${node}` : ''} was lost` : `its node${node ? ` ${node}` : ''} was lost`;
  else if (reason === 'succeeded' || reason === 'cancelled') what = who;
  else if (who && code != null) what = `${who} exited with code ${code}`;
  else if (code != null) what = `exit code ${code}`;
  // "on n1" and "node n1 drained: …" say the node twice: the detail says it
  else if (detail && rank == null && node && String(detail).includes(node)) what = null;
  else what = who;
  const more = labels(rest);
  const said = [what, detail, ...more].filter(Boolean).join(', ');
  return `${reason || 'ended'}${said ? `: ${said}` : ''}`;
}

/** Where the cause a decision starts with ends: "reason", or "reason (bits)" whose
 * last bit may be the exit's detail, free text with ": " or parentheses of its own
 * ("preempted (node n1 drained: bad ECC): retried, …"); -1 when it cannot tell. */
function causeEnd(text, reason, detail) {
  if (!text.startsWith(reason)) return -1;
  const after = reason.length;
  if (text.startsWith(': ', after)) return after;
  if (!text.startsWith(' (', after)) return -1;
  if (detail) {
    const at = text.indexOf(`${detail}): `, after);
    if (at >= 0) return at + String(detail).length + 1;
  }
  let depth = 0;
  for (let i = after + 1; i < text.length; i++) {
    if (text[i] === '(') depth++;
    else if (text[i] === ')' && --depth === 0) return i + 1;
  }
  return -1;
}

/** What the retry rules decided, without the cause it starts with (the exit says it):
 * "not retried (rule 1 says fail)"; the whole sentence when it starts otherwise. */
export function decisionText(exit) {
  const text = exit && exit.decision;
  if (!text) return null;
  if (exit.reason) {
    const end = causeEnd(text, exit.reason, exit.detail);
    if (end >= 0 && text.startsWith(': ', end) && end + 2 < text.length) return text.slice(end + 2);
  }
  return text;
}

const DRAIN_SAID = {
  keep: 'cordoned: its jobs run on',
  stop: 'drained: its jobs were preempted and requeued',
  wait: 'draining: its jobs may finish',
};

/** A node's cordon (GET /v1/nodes) as a person reads it: {reason, who, mode};
 * null for a node without one. who: "by ops-oncall", or for a node that cordoned
 * itself after repeated rank_failed attempts (auto) "by gpujobs (automatic)". */
export function cordonText(cordon) {
  if (!cordon) return null;
  return {
    reason: cordon.reason || 'no reason given',
    who: cordon.auto ? `by ${cordon.by || 'gpujobs'} (automatic)` : `by ${cordon.by || '?'}`,
    mode: DRAIN_SAID[cordon.drain] || `drain: ${cordon.drain}`,
  };
}

/** The priority class of a spec that names none (the server's, always configured). */
export const DEFAULT_CLASS = 'default';

/** "class urgent, priority 0": the job's priority class (the operator's) and its
 * own priority within it, as `gpujobs describe` says them. */
export function priorityText(spec) {
  const s = spec || {};
  return `class ${s.priority_class || DEFAULT_CLASS}, priority ${s.priority ?? 0}`;
}

/** A PENDING job's preemption in progress: {jobs, cls, at} while it waits for the
 * running jobs of lower classes it preempted to stop; null otherwise (the server
 * removes it once the job is placed). */
export function preemptingOf(job) {
  const p = job && job.preempting;
  if (!p || job.state !== 'PENDING') return null;
  return { jobs: Array.isArray(p.jobs) ? p.jobs.map(String) : [], cls: p.class || null, at: p.at || null };
}

/** "preempting job_a, job_b (urgent)", or null (preemptingOf). */
export function preemptingText(job) {
  const p = preemptingOf(job);
  if (!p) return null;
  return `preempting ${p.jobs.join(', ') || 'jobs of lower classes'}${p.cls ? ` (${p.cls})` : ''}`;
}

const JOB_ID = /job_[0-9A-HJKMNP-TV-Z]{26}/g;

/** Free text cut where it names jobs, so a page can link them: "by job_X, priority
 * class urgent" -> ["by ", {job: "job_X"}, ", priority class urgent"]. */
export function jobIdParts(text) {
  const s = text == null ? '' : String(text);
  const out = [];
  let last = 0;
  for (const m of s.matchAll(JOB_ID)) {
    if (m.index > last) out.push(s.slice(last, m.index));
    out.push({ job: m[0] });
    last = m.index + m[0].length;
  }
  if (last < s.length) out.push(s.slice(last));
  return out;
}

/** "3 (2 counted of max 3, 1 not counted)", or "3 of max 3" when every retry counted. */
export function attemptText(job) {
  const max = (job.spec || {}).max_attempts ?? 1;
  const free = job.uncounted_retries || 0;
  if (!free) return `${job.attempt} of max ${max}`;
  return `${job.attempt} (${job.attempt - free} counted of max ${max}, ${free} not counted)`;
}

/** What is left of the limit that applies now: "times out in 3 h 12 min" (a RUNNING
 * attempt's max_runtime_s, from started_at), "gives up waiting in 12 min" (a PENDING
 * job's max_pending_s, from pending_since); null when none applies. */
export function timeLeftText(job, now = Date.now()) {
  const spec = job.spec || {};
  const left = (from, limit) => (new Date(from).getTime() + limit * 1000 - now) / 1000;
  if (job.state === 'RUNNING' && spec.max_runtime_s != null && job.started_at) {
    const s = left(job.started_at, spec.max_runtime_s);
    return s >= 0 ? `times out in ${duration(s)}` : `over its max runtime by ${duration(-s)}: being stopped`;
  }
  if (job.state === 'PENDING' && spec.max_pending_s != null && job.pending_since) {
    const s = left(job.pending_since, spec.max_pending_s);
    return s >= 0 ? `gives up waiting in ${duration(s)}`
      : `waited past its max pending by ${duration(-s)}: ends FAILED when the placer next looks`;
  }
  return null;
}

// what the event's own sentence (its reason) already says, by type
const SAID = {
  rank_started: ['ranks'], rank_exited: ['ranks', 'exit_code'], rank_stopped: ['ranks'],
  stalled: ['rank', 'ranks'], recovered: ['rank', 'incident'], finished: ['state'],
  preempting: ['jobs'], // a line of its own, each job linked (job.js)
};

/** An event's fields beyond its type, time and sentence, as labels: ["attempt 1", "on node-1"]. */
export function eventLabels(type, extra) {
  const skip = new Set([...(SAID[type] || []), 'decision']); // the decision: a line of its own
  return labels(Object.fromEntries(Object.entries(extra || {}).filter(([k]) => !skip.has(k))));
}

const isRanks = (v) => Array.isArray(v) && v.every((x) => Number.isInteger(x));
const rankList = (v) => `${noun(v.length, 'rank')} ${ranges(v)}`;
// a span as the placed event gives a node's ranks: "0-1023" or "0-3,7"
const isSpan = (v) => typeof v === 'string' && /^\d+(-\d+)?(,\d+(-\d+)?)*$/.test(v);
const spanRanks = (v) => v.split(',').flatMap((run) => {
  const [a, b = a] = run.split('-').map(Number);
  return Array.from({ length: b - a + 1 }, (_, i) => a + i);
});

const LABEL = {
  attempt: (v) => `attempt ${v}`,
  next_attempt: (v) => `next attempt ${v}`,
  rank: (v) => `rank ${v}`,
  ranks: (v) => (isRanks(v) ? rankList(v) : null),
  co_first: (v) => (isRanks(v) ? `co-first ${rankList(v)}` : null),
  exit_code: (v) => `exit code ${v}`,
  node_id: (v) => `on ${v}`,
  suspect_node: (v) => `suspect node ${v}`,
  state: (v) => `now ${v}`,
  by: (v) => `by ${v}`,
  tenant: (v) => `tenant ${v}`,
  nodes: (v) => (Array.isArray(v) ? `${noun(v.length, 'node')} ${v.join(', ')}`
    : `on ${Object.entries(v).map(([n, rs]) => (isRanks(rs) ? `${n} (${rankList(rs)})`
      : isSpan(rs) ? `${n} (${rankList(spanRanks(rs))})` : n)).join(', ')}`),
};

/** Any other field: "its name value", a list joined, an object as its keys' labels. */
function plain(key, value) {
  const name = key.replace(/_/g, ' ');
  if (Array.isArray(value)) {
    return value.every((x) => x == null || typeof x !== 'object')
      ? `${name} ${value.join(', ')}` : `${name}: ${count(value.length, 'item')}`;
  }
  if (typeof value === 'object') return `${name}: ${labels(value).join(', ')}`;
  if (typeof value === 'boolean') return value ? name : `not ${name}`;
  return `${name} ${value}`;
}

function labels(fields) {
  return Object.entries(fields || {}).filter(([, v]) => v != null && v !== '')
    .map(([k, v]) => (LABEL[k] ? LABEL[k](v) ?? plain(k, v) : plain(k, v)));
}

const GANG = /\b(\d+) x (\d+) free (?:(\S+) )?GPUs\b/;

/** The placer's "waiting for 4 x 2 free h100 GPUs on READY nodes" with its
 * counts said in words: "waiting for 4 ranks × 2 free h100 GPUs each on READY
 * nodes"; any other text as it is. */
export function pendingWords(text) {
  if (!text) return text || '';
  return String(text).replace(GANG, (_, ranks, each, kind) =>
    `${count(Number(ranks), 'rank')} × ${count(Number(each), `free ${kind ? `${kind} ` : ''}GPU`)} each`);
}
