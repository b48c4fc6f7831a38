// The API's records as a person reads them: an exit as a sentence, an event's
// details as short labels. Nothing the dashboard prints is JSON (the Spec
// section excepted: it is the document the job was submitted with).
import { count, noun, ranges } from './dom.js';

/** {"reason":"rank_failed","exit_code":1,"rank":3} -> "rank_failed: rank 3 exited with code 1" */
export function exitText(exit) {
  if (!exit) return null;
  const { reason, exit_code: code, rank, ...rest } = exit;
  const who = rank != null ? `rank ${rank}` : null;
  let what = null;
  if (reason === 'node_lost') what = who ? `${who}'s node was lost` : 'its node was lost';
  else if (reason === 'succeeded' || reason === 'cancelled') what = who;
  else if (who && code != null) what = `${who} exited with code ${code}`;
  else if (code != null) what = `exit code ${code}`;
  else what = who;
  const more = labels(rest);
  const said = [what, ...more].filter(Boolean).join(', ');
  return `${reason || 'ended'}${said ? `: ${said}` : ''}`;
}

// what the event's own sentence (its reason) already says, by type
const SAID = {
  rank_started: ['ranks'], rank_exited: ['ranks', 'exit_code'], rank_stopped: ['ranks'],
  stalled: ['rank', 'ranks'], finished: ['state'],
};

/** An event's fields beyond its type, time and sentence, as labels: ["attempt 1", "on node-1"]. */
export function eventLabels(type, extra) {
  const skip = new Set(SAID[type] || []);
  return labels(Object.fromEntries(Object.entries(extra || {}).filter(([k]) => !skip.has(k))));
}

const isRanks = (v) => Array.isArray(v) && v.every((x) => Number.isInteger(x));
const rankList = (v) => `${noun(v.length, 'rank')} ${ranges(v)}`;

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
    : `on ${Object.entries(v).map(([n, rs]) => (isRanks(rs) ? `${n} (${rankList(rs)})` : n)).join(', ')}`),
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
