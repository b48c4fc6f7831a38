// The public JSON API, called with the user's bearer token. The token lives
// in sessionStorage only: never in a URL, never in a cookie.

const TOKEN_KEY = 'gpujobs.token';
// this module is served from <root>/static/api.js; the API is under <root>/v1/
const ROOT = new URL('../', import.meta.url);

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY),
  set: (t) => sessionStorage.setItem(TOKEN_KEY, t),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

export class ApiError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
    this.code = problem && problem.code;
    this.retryAfter = null; // seconds, from a Retry-After header (409 request_in_progress, 429)
  }
}

let onUnauthenticated = () => {};
export function whenUnauthenticated(fn) { onUnauthenticated = fn; }

export async function call(method, path, { query, body, signal, headers: extra } = {}) {
  const url = new URL(path, ROOT);
  for (const [k, v] of Object.entries(query || {})) {
    if (v != null && v !== '') url.searchParams.set(k, v);
  }
  const headers = { ...extra, Authorization: `Bearer ${token.get() || ''}`, Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const res = await fetch(url, {
    method, headers, signal, cache: 'no-store', credentials: 'omit',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!res.ok) {
    if (res.status === 401) onUnauthenticated();
    const err = new ApiError(res.status, data);
    const after = res.headers.get('Retry-After');
    if (after && Number.isFinite(Number(after))) err.retryAfter = Number(after);
    throw err;
  }
  return { status: res.status, data };
}

const id = (s) => encodeURIComponent(s);
const get = async (path, query) => (await call('GET', path, { query })).data;

/** null when the endpoint (or the thing) is not there: the page says so and goes on. */
async function optional(promise) {
  try { return await promise; } catch (e) {
    if (e instanceof ApiError && (e.status === 404 || e.status === 405 || e.status === 501)) return null;
    throw e;
  }
}

export const api = {
  listJobs: ({ state, pageSize = 25, pageToken } = {}) =>
    get('v1/jobs', { state, page_size: pageSize, page_token: pageToken }),
  /** An array's children (only those made so far), in index order. */
  children: (parentId, { state, pageSize = 500, pageToken } = {}) =>
    get('v1/jobs', { parent: parentId, state, page_size: pageSize, page_token: pageToken }),
  job: (jobId) => get(`v1/jobs/${id(jobId)}`),
  attempts: (jobId) => get(`v1/jobs/${id(jobId)}/attempts`),
  /** Every rank of the current attempt, longest silent first (ties by rank):
   * the pages the server cuts a big attempt's view into (rank ranges, each in
   * that order) read to the end and put in that order together; the rest of
   * the answer is the first page's. */
  ranks: async (jobId) => {
    const path = `v1/jobs/${id(jobId)}/ranks`;
    const first = await get(path);
    let rows = first.ranks || [];
    const seen = new Set();
    for (let t = first.next_page_token; t; ) {
      if (seen.has(t)) throw new ApiError(502, { detail: 'the server returned a ranks page token twice' });
      seen.add(t);
      const page = await get(path, { page_token: t });
      rows = rows.concat(page.ranks || []);
      t = page.next_page_token;
    }
    if (!seen.size) return first;
    rows.sort((a, b) => (b.silence_s || 0) - (a.silence_s || 0) || a.rank - b.rank);
    return { ...first, ranks: rows, next_page_token: null };
  },
  nodes: () => get('v1/nodes'),
  /** GET /v1/usage: {rows} by period, tenant, then group (query: start, end, granularity, group_by). */
  usage: (query) => get('v1/usage', query),
  /** POST /v1/jobs under an Idempotency-Key: the same key and body answer the same job. */
  submit: (body, idempotencyKey) =>
    call('POST', 'v1/jobs', { body, headers: { 'Idempotency-Key': idempotencyKey } }),
  cancel: (jobId, reason) =>
    call('POST', `v1/jobs/${id(jobId)}/cancel`, { body: reason ? { reason } : {} }),
  // The job's story and its output come from endpoints that may not exist on
  // an older server: these two return null then.
  events: async (jobId) => {
    const data = await optional(get(`v1/jobs/${id(jobId)}/events`));
    return data == null ? null : normaliseEvents(data);
  },
  /** One page of the job's logs for `query` (tail, since, page_size, page_token:
   * logs.js says which), as {attempt, lines, nextPageToken}. */
  logs: async (jobId, query = {}) => {
    const data = await optional(get(`v1/jobs/${id(jobId)}/logs`, query));
    return data == null ? null : normaliseLogPage(data);
  },
};

// -- shapes of the optional endpoints, kept in one place --------------------
const pick = (o, ...keys) => { for (const k of keys) if (o && o[k] != null) return o[k]; return null; };

export function normaliseEvents(data) {
  const list = Array.isArray(data) ? data : pick(data, 'events', 'items') || [];
  const known = new Set(['at', 'time', 'timestamp', 'created_at', 'type', 'kind', 'event',
    'reason', 'detail', 'message', 'stacks', 'decision']);
  return list.map((e) => {
    const rest = Object.fromEntries(Object.entries(e || {}).filter(([k]) => !known.has(k)));
    return {
      at: pick(e, 'at', 'time', 'timestamp', 'created_at'),
      type: String(pick(e, 'type', 'kind', 'event') || 'event'),
      detail: String(pick(e, 'reason', 'detail', 'message') || ''),
      decision: e && e.decision ? String(e.decision) : null, // retried, finished: what the retry rules decided
      extra: rest, // the event's other fields: said as labels (story.js eventLabels)
      stacks: Array.isArray(e && e.stacks) ? e.stacks : [], // rank_stopped: each rank's stack at the stop
    };
  });
}

export function normaliseLogPage(data) {
  return {
    attempt: data && !Array.isArray(data) && data.attempt != null ? data.attempt : null,
    lines: normaliseLogs(data),
    nextPageToken: (data && !Array.isArray(data) && data.next_page_token) || null,
    // the position after the page's last line, on the last page too: polled for what is new
    followToken: (data && !Array.isArray(data) && data.follow_token) || null,
  };
}

export function normaliseLogs(data) {
  const list = Array.isArray(data) ? data : pick(data, 'lines', 'events', 'logs', 'items') || [];
  return list.map((l) => (typeof l === 'string' ? { at: null, rank: null, stream: '', text: l, id: null } : {
    id: pick(l, 'id'),
    at: pick(l, 'time', 'timestamp', 'at'),
    rank: pick(l, 'rank'),
    stream: String(pick(l, 'stream') || ''),
    text: String(pick(l, 'line', 'message', 'text') ?? ''),
    seq: typeof l.seq === 'number' ? l.seq : null, // the line's offset in its rank's file
  }));
}
