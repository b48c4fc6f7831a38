// Nodes: every GPU host with its GPUs used and free, state, cordon (why an
// operator, or the node itself, took it out of placement) and last call-in,
// and which of the caller's jobs use them (the API names no other tenant's).
// Operators cordon, drain and uncordon with the CLI (gpujobs nodes ...): the
// page only shows it.
import { api } from './api.js';
import { h, setText, stateBadge, ago, time, poll, problemText, naturalCompare, count } from './dom.js';
import { cordonText } from './story.js';

const REFRESH_MS = 3000;
/** the caller's jobs read per state that holds GPUs (the first page of each) */
const LIST_MAX = 100;
const HOLDING = ['RUNNING', 'SCHEDULED'];
/** attempts read at a time */
const CONCURRENCY = 4;

/** fn over items, at most n at a time, results in the items' order. */
async function mapBounded(items, n, fn) {
  const out = new Array(items.length);
  let next = 0;
  const worker = async () => { while (next < items.length) { const i = next++; out[i] = await fn(items[i]); } };
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, worker));
  return out;
}

/** node id -> GPUs of one attempt there: its placement's ranks on the node × the spec's gpus_per_rank. */
export function gpusByNode(placement, gpusPerRank) {
  const out = new Map();
  for (const p of placement || []) out.set(p.node_id, (out.get(p.node_id) || 0) + (gpusPerRank ?? 1));
  return out;
}

/** "job_01J…P4R5S": the id's start and its random end, enough to tell jobs apart. */
export function shortId(id) {
  return id.length > 14 ? `${id.slice(0, 7)}…${id.slice(-5)}` : id;
}

/** The caller's share of every node: a reader whose read() answers node id ->
 * [{job, gpus}] (name order) and whether the listing was cut short. An
 * attempt's placement never changes, so each (job, attempt) is read once. */
function holdings() {
  const placed = new Map(); // "<job id>#<attempt>" -> gpusByNode
  async function read() {
    const pages = await Promise.all(HOLDING.map((state) => api.listJobs({ state, pageSize: LIST_MAX })));
    const jobs = [...new Map(pages.flatMap((pg) => pg.jobs).map((j) => [j.id, j])).values()];
    const keyOf = (j) => `${j.id}#${j.attempt}`;
    await mapBounded(jobs.filter((j) => j.attempt && !placed.has(keyOf(j))), CONCURRENCY, async (j) => {
      const { attempts } = await api.attempts(j.id);
      const current = attempts.find((a) => a.attempt === j.attempt);
      if (current) placed.set(keyOf(j), gpusByNode(current.placement, j.spec.gpus_per_rank));
    });
    const live = new Set(jobs.map(keyOf));
    for (const k of placed.keys()) if (!live.has(k)) placed.delete(k);
    const byNode = new Map();
    for (const j of jobs) {
      for (const [node, gpus] of placed.get(keyOf(j)) || []) {
        if (!byNode.has(node)) byNode.set(node, []);
        byNode.get(node).push({ job: j, gpus });
      }
    }
    for (const list of byNode.values()) list.sort((a, b) => naturalCompare(a.job.name || a.job.id, b.job.name || b.job.id));
    return { byNode, cut: pages.some((pg) => pg.next_page_token) };
  }
  return { read };
}

/** A node's "Cordon" cell: its reason, then who, what it does to the jobs there
 * and since when; "—" for a node that takes placements. */
function cordonItems(cordon) {
  const c = cordonText(cordon);
  if (!c) return [h('span', { class: 'muted', text: '—' })];
  return [h('p', { class: 'cordon-reason', text: c.reason }),
    h('p', { class: 'muted small', text: `${c.who} · ${c.mode} · since ${ago(cordon.at)}`, title: time(cordon.at) })];
}

/** The lines of a node's "In use by" cell: the caller's jobs, then the GPUs
 * in use by anyone else (said as a number, never as jobs). */
function usageItems(mine, used, cut) {
  const items = mine.map(({ job, gpus }) => h('li', {},
    h('a', { href: `#/jobs/${encodeURIComponent(job.id)}`, text: job.name || shortId(job.id), title: job.id }),
    job.name ? ` (${shortId(job.id)})` : '', `: ${count(gpus, 'GPU')}`));
  const others = used - mine.reduce((n, m) => n + m.gpus, 0);
  if (others > 0) {
    items.push(h('li', { class: 'muted', text: cut
      ? `other tenants, or your jobs past the first ${LIST_MAX} listed: ${count(others, 'GPU')}`
      : `other tenants: ${count(others, 'GPU')}` }));
  }
  return items;
}

export function mount(main) {
  document.title = 'Nodes · gpujobs';
  const totals = h('p', { id: 'nodes-total', role: 'status' });
  const tbody = h('tbody', { id: 'nodes-body' });
  const error = h('p', { class: 'error', role: 'alert' });
  const usageError = h('p', { class: 'error', role: 'alert' });
  main.append(h('h1', { text: 'Nodes' }), totals, error, usageError,
    h('div', { class: 'table-wrap' }, h('table', { class: 'nodes' },
      h('caption', { class: 'sr-only', text: 'GPU nodes' }),
      h('thead', {}, h('tr', {}, ['Node', 'State', 'Cordon', 'GPU type', 'GPUs used', 'Used / free', 'In use by', 'Last call-in', 'Labels']
        .map((t) => h('th', { scope: 'col', text: t })))), tbody)));
  const rows = new Map();
  const share = holdings();

  async function refresh() {
    try {
      // the nodes are shown even when the caller's placements cannot be read
      const [{ nodes }, usage] = await Promise.all([api.nodes(), share.read().catch((e) => {
        setText(usageError, `Could not read which of your jobs use the nodes: ${problemText(e)}`);
        return null;
      })]);
      if (usage) usageError.textContent = '';
      nodes.sort((a, b) => naturalCompare(a.node_id, b.node_id));
      let used = 0; let total = 0;
      const keep = new Set();
      let cursor = tbody.firstChild;
      for (const n of nodes) {
        keep.add(n.node_id);
        used += n.gpus - n.gpus_free; total += n.gpus;
        let r = rows.get(n.node_id);
        if (!r) {
          r = { tr: h('tr', { dataset: { node: n.node_id } }), name: h('code'), state: h('td'), cordon: h('td', { class: 'cordon' }), type: h('td'), meter: h('meter', { min: 0 }), nums: h('td', { class: 'num' }), users: h('ul', { class: 'plain users' }), seen: h('td'), labels: h('td') };
          r.tr.append(h('td', {}, r.name), r.state, r.cordon, r.type, h('td', {}, r.meter), r.nums, h('td', { class: 'users' }, r.users), r.seen, r.labels);
          rows.set(n.node_id, r);
        }
        setText(r.name, n.node_id);
        if (r.state.dataset.state !== n.state) { r.state.dataset.state = n.state; r.state.replaceChildren(stateBadge(n.state)); }
        const cordonKey = JSON.stringify([n.cordon || null, n.cordon ? ago(n.cordon.at) : '']);
        if (r.cordonKey !== cordonKey) {
          r.cordonKey = cordonKey;
          r.cordon.replaceChildren(...cordonItems(n.cordon));
          r.tr.classList.toggle('cordoned', !!n.cordon);
        }
        setText(r.type, n.gpu_type);
        r.meter.max = n.gpus; r.meter.value = n.gpus - n.gpus_free;
        setText(r.meter, `${n.gpus - n.gpus_free} of ${n.gpus}`);
        setText(r.nums, `${n.gpus - n.gpus_free} used / ${n.gpus_free} free`);
        if (usage) {
          const mine = usage.byNode.get(n.node_id) || [];
          const key = JSON.stringify([n.gpus - n.gpus_free, usage.cut, mine.map((m) => [m.job.id, m.job.name, m.gpus])]);
          if (r.usersKey !== key) {
            r.usersKey = key;
            r.users.replaceChildren(...usageItems(mine, n.gpus - n.gpus_free, usage.cut));
          }
        }
        setText(r.seen, ago(n.last_seen_at)); r.seen.title = time(n.last_seen_at);
        setText(r.labels, Object.entries(n.labels || {}).map(([k, v]) => `${k}=${v}`).join(' '));
        if (r.tr === cursor) cursor = cursor.nextSibling; else tbody.insertBefore(r.tr, cursor);
      }
      for (const [id, r] of rows) if (!keep.has(id)) { r.tr.remove(); rows.delete(id); }
      setText(totals, nodes.length ? `${count(nodes.length, 'node')} · ${used} of ${count(total, 'GPU')} in use · ${total - used} free`
        : 'No nodes have registered.');
      error.textContent = '';
    } catch (e) {
      setText(error, `Could not load the nodes: ${problemText(e)}`);
    }
  }
  const poller = poll(refresh, REFRESH_MS);
  return () => poller.stop();
}
