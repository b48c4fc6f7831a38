// Nodes: every GPU host with its GPUs used and free, state and last call-in.
import { api } from './api.js';
import { h, setText, stateBadge, ago, time, poll, problemText, naturalCompare, count } from './dom.js';

const REFRESH_MS = 3000;

export function mount(main) {
  document.title = 'Nodes · gpujobs';
  const totals = h('p', { id: 'nodes-total', role: 'status' });
  const tbody = h('tbody', { id: 'nodes-body' });
  const error = h('p', { class: 'error', role: 'alert' });
  main.append(h('h1', { text: 'Nodes' }), totals, error,
    h('div', { class: 'table-wrap' }, h('table', { class: 'nodes' },
      h('caption', { class: 'sr-only', text: 'GPU nodes' }),
      h('thead', {}, h('tr', {}, ['Node', 'State', 'GPU type', 'GPUs used', 'Used / free', 'Last call-in', 'Labels']
        .map((t) => h('th', { scope: 'col', text: t })))), tbody)));
  const rows = new Map();

  async function refresh() {
    try {
      const { nodes } = await api.nodes();
      nodes.sort((a, b) => naturalCompare(a.node_id, b.node_id));
      let used = 0; let total = 0;
      const keep = new Set();
      let cursor = tbody.firstChild;
      for (const n of nodes) {
        keep.add(n.node_id);
        used += n.gpus - n.gpus_free; total += n.gpus;
        let r = rows.get(n.node_id);
        if (!r) {
          r = { tr: h('tr'), name: h('code'), state: h('td'), type: h('td'), meter: h('meter', { min: 0 }), nums: h('td', { class: 'num' }), seen: h('td'), labels: h('td') };
          r.tr.append(h('td', {}, r.name), r.state, r.type, h('td', {}, r.meter), r.nums, r.seen, r.labels);
          rows.set(n.node_id, r);
        }
        setText(r.name, n.node_id);
        if (r.state.dataset.state !== n.state) { r.state.dataset.state = n.state; r.state.replaceChildren(stateBadge(n.state)); }
        setText(r.type, n.gpu_type);
        r.meter.max = n.gpus; r.meter.value = n.gpus - n.gpus_free;
        setText(r.meter, `${n.gpus - n.gpus_free} of ${n.gpus}`);
        setText(r.nums, `${n.gpus - n.gpus_free} used / ${n.gpus_free} free`);
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
