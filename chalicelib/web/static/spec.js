// A job's spec, said in words (no JSON), and the body that submits it again.
import { h, count } from './dom.js';

/** What POST /v1/jobs accepts (chalicelib/api/schemas.py JOB_CREATE, JobCreate in
 * docs/openapi.yaml). A job's spec is its create body with the defaults filled
 * (JobSpec), so these of its members make a body the server takes back as it is. */
export const CREATE_FIELDS = ['name', 'command', 'working_dir', 'env', 'ranks', 'gpus_per_rank',
  'gpu_type', 'priority', 'priority_class', 'max_attempts', 'retry', 'max_runtime_s', 'warn_before_s', 'warn_signal',
  'max_pending_s', 'checkpoint_dir', 'heartbeat', 'on_stall', 'depends_on', 'array', 'labels'];

/** The create body of a job like this one: its spec's create members, nothing else. */
export function createBody(spec) {
  return Object.fromEntries(CREATE_FIELDS.filter((k) => spec[k] !== undefined).map((k) => [k, spec[k]]));
}

/** A fresh Idempotency-Key (crypto.randomUUID in a secure context, else the same from getRandomValues). */
export function newKey() {
  if (typeof crypto.randomUUID === 'function') return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40; b[8] = (b[8] & 0x3f) | 0x80;
  const x = [...b].map((v) => v.toString(16).padStart(2, '0')).join('');
  return `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20)}`;
}

/** One word of a POSIX shell command line: as it is when nothing in it is special, else quoted. */
export function shellWord(s) {
  const t = String(s);
  if (/^[A-Za-z0-9_@%+=:,./-]+$/.test(t)) return t;
  return `'${t.replace(/'/g, `'\\''`)}'`;
}

export function shellLine(argv) {
  return (argv || []).map(shellWord).join(' ');
}

/** Any JSON value as plain text: lists as "a, b", objects as "k=v, k=v", never braces or quotes. */
export function plain(v) {
  if (v == null) return '—';
  if (Array.isArray(v)) return v.map(plain).join(', ');
  if (typeof v === 'object') return Object.entries(v).map(([k, x]) => `${k}=${plain(x)}`).join(', ');
  return String(v);
}

const MODES = {
  auto: 'heartbeats, once any rank has sent one (mode auto)',
  beats: 'heartbeats, from the attempt’s start (mode beats)',
  process: 'process activity alone (mode process)',
  off: 'nothing: stall detection is off (mode off)',
};
const ON_STALL = {
  report: 'report it (the job keeps running)',
  restart: 'stop the attempt and start a new one while attempts remain',
};
const s = (v) => `${v} s`;

/** The heartbeat settings as short sentences, one a line. */
export function heartbeatLines(hb) {
  const { mode, interval_s: every, startup_grace_s: grace, false_positive_budget_per_hour: budget,
    miss_probability: miss, max_busy_s: busy, idle_s: idle, ...rest } = hb || {};
  return [
    mode != null && `Judged by ${MODES[mode] || `mode ${mode}`}.`,
    every != null && `A heartbeat expected every ${s(every)}.`,
    grace != null && `Startup grace ${s(grace)}: no rank is stalled before its first heartbeat until then.`,
    (budget != null || miss != null) &&
      `The threshold allows ${budget ?? '—'} false alarms per hour, given a miss probability of ${miss ?? '—'} per interval.`,
    busy != null && `Busy I/O (a checkpoint) excuses silence for up to ${s(busy)} past the threshold.`,
    idle != null && `Idle for ${s(idle)} (no CPU, no I/O) counts as stalled in mode process.`,
    ...Object.entries(rest).map(([k, v]) => `${k}: ${plain(v)}`),
  ].filter(Boolean);
}

/** The environment's variable names only: its values are not shown. */
function envView(env) {
  const names = Object.keys(env || {}).sort();
  if (!names.length) return 'none';
  return h('span', {}, `${count(names.length, 'variable')}: `,
    names.map((n, i) => [i ? ', ' : '', h('code', { text: n })]),
    h('span', { class: 'muted', text: ' (values are not shown)' }));
}

/** Members the summary above the spec already says (job.js facts), and the title (name). */
export const SUMMARY_FIELDS = new Set(['name', 'command', 'ranks', 'gpus_per_rank', 'gpu_type',
  'priority_class', 'working_dir', 'labels', 'retry', 'max_runtime_s', 'warn_before_s', 'warn_signal',
  'max_pending_s', 'checkpoint_dir', 'depends_on', 'array']);

// -- the lifecycle: retry rules and time limits, as the CLI's describe says them
// (gpujobs_client/lifecycle.py)
export const DEFAULT_MAX_UNCOUNTED = 10;
const ACTION_WORDS = { retry: 'retry', retry_uncounted: 'retry, not counted', fail: 'fail' };

/** A span of seconds, every unit said: 14400 -> "4 h", 5400 -> "1 h 30 min", 90 -> "1 min 30 s". */
export function exactDuration(seconds) {
  let t = Math.max(0, Math.floor(Number(seconds) || 0));
  const parts = [];
  for (const [name, size] of [['d', 86400], ['h', 3600], ['min', 60], ['s', 1]]) {
    if (t >= size) parts.push(`${Math.floor(t / size)} ${name}`);
    t %= size;
  }
  return parts.join(' ') || '0 s';
}

/** {"exit_codes": [42], "action": "fail"} -> "exit 42 → fail" */
export function retryRuleText(rule) {
  const what = [
    (rule.reasons || []).length ? rule.reasons.join(' or ') : null,
    (rule.exit_codes || []).length ? `exit ${rule.exit_codes.join(', ')}` : null,
    (rule.signals || []).length ? rule.signals.join(' or ') : null,
  ].filter(Boolean);
  return `${what.join(' and ') || 'anything'} → ${ACTION_WORDS[rule.action] || rule.action}`;
}

/** The retry policy in words: "exit 42 → fail; node_lost → retry, not counted; then defaults (...)". */
export function retryPolicyText(spec) {
  const policy = (spec && spec.retry) || {};
  const cap = policy.max_uncounted_retries ?? DEFAULT_MAX_UNCOUNTED;
  const defaults = `defaults (infra causes not counted, up to ${cap})`;
  const rules = (policy.rules || []).map(retryRuleText);
  return rules.length ? [...rules, `then ${defaults}`].join('; ') : defaults;
}

/** "max runtime 4 h per attempt (warning SIGUSR1 5 min before)", "max pending 30 min". */
export function limitsLines(spec) {
  const out = [];
  if (spec.max_runtime_s != null) {
    const warn = spec.warn_before_s != null
      ? ` (warning ${spec.warn_signal || 'SIGUSR1'} ${exactDuration(spec.warn_before_s)} before)` : '';
    out.push(`max runtime ${exactDuration(spec.max_runtime_s)} per attempt${warn}`);
  }
  if (spec.max_pending_s != null) out.push(`max pending ${exactDuration(spec.max_pending_s)}`);
  return out;
}

/** [label, value] pairs of the spec's other members: every one said, the unknown as "key: value". */
export function specPairs(spec) {
  const known = new Set([...SUMMARY_FIELDS, 'priority', 'max_attempts', 'on_stall', 'heartbeat', 'env']);
  return [
    ['Priority', spec.priority != null ? `${spec.priority} (higher places first)` : null],
    ['Max attempts', spec.max_attempts != null ? `${spec.max_attempts}` : null],
    ['On a stall', spec.on_stall != null ? ON_STALL[spec.on_stall] || spec.on_stall : null],
    ['Stall detection', spec.heartbeat ? h('ul', { class: 'plain' }, heartbeatLines(spec.heartbeat).map((t) => h('li', { text: t }))) : null],
    ['Environment', envView(spec.env)],
    ...Object.entries(spec).filter(([k]) => !known.has(k)).map(([k, v]) => [k, plain(v)]),
  ];
}
