// The pools page (`/pools`): every worker pool (`augur worker --pool`) with its workers
// (host, slots and GPUs busy and idle, last seen), the studies waiting for its slots (the
// queue) and its utilisation over time (busy against idle slot-seconds per minute: what the
// pool costs while idle). Read from /v1/pools and /v1/pools/{pool}, again every 5 s.

import { api } from './api.js';
import { plotly, PLOT_CONFIG, baseLayout } from './charts.js';
import { $, fmt, h } from './dom.js';
import { mark } from './marks.js';

const REFRESH_MS = 5000;

export async function poolsPage() {
  const list = h('div', { id: 'pools' });
  $('#main').replaceChildren(
    h('h1', {}, 'Worker pools'),
    h('p', { class: 'muted' },
      'Workers started with augur worker --pool NAME run the trials of every study whose trial_job says executor: pool, pool: NAME.'),
    list);
  async function load() {
    const { pools } = await api('/v1/pools');
    const details = await Promise.all(pools.map((p) => api('/v1/pools/' + encodeURIComponent(p.name))));
    list.replaceChildren(...(details.length ? details.map(poolCard) : [h('p', { class: 'muted' }, 'No pool yet.')]));
    for (const pool of details) drawUsage(pool);
    mark('pools');
  }
  await load();
  setInterval(() => load().catch(() => {}), REFRESH_MS);
}

const pct = (x) => Math.round(100 * x) + ' %';
const secs = (x) => fmt(Math.round(x)) + ' slot-s';

function poolCard(pool) {
  return h('div', { class: 'card pool', id: 'pool-' + pool.name },
    h('h2', {}, pool.name),
    h('table', { class: 'plain pool-summary' }, h('tbody', {},
      h('tr', {}, h('th', {}, 'workers'), h('td', {}, pool.workers + (pool.workers_gone ? ' (' + pool.workers_gone + ' gone)' : ''))),
      h('tr', {}, h('th', {}, 'slots busy / idle'), h('td', { class: 'slots' }, pool.busy_slots + ' / ' + pool.idle_slots)),
      h('tr', {}, h('th', {}, 'queue'), h('td', { class: 'queue' }, pool.queue_length + ' trials of ' + pool.studies_waiting + ' studies waiting')),
      h('tr', {}, h('th', {}, 'utilisation'), h('td', {}, pct(pool.utilisation) + ' (busy ' + secs(pool.busy_slot_secs) + ', idle ' + secs(pool.idle_slot_secs) + ')')))),
    h('h3', {}, 'Workers'),
    h('table', { class: 'plain workers' },
      h('thead', {}, h('tr', {}, ['worker', 'host', 'slots', 'busy', 'idle', 'GPUs', 'state', 'last seen', 'busy / idle slot-s'].map((c) => h('th', {}, c)))),
      h('tbody', {}, pool.worker_list.map((w) => h('tr', { class: w.live ? '' : 'muted' },
        h('td', {}, w.id), h('td', {}, w.host), h('td', {}, w.slots), h('td', {}, w.busy), h('td', {}, w.idle),
        h('td', {}, w.gpus.join(', ') || '—'), h('td', {}, w.live ? 'live' : 'gone'),
        h('td', {}, new Date(w.last_seen_at).toLocaleString()),
        h('td', {}, fmt(Math.round(w.busy_slot_secs)) + ' / ' + fmt(Math.round(w.idle_slot_secs))))))),
    h('h3', {}, 'Studies'),
    h('table', { class: 'plain studies' },
      h('thead', {}, h('tr', {}, ['study', 'weight', 'running', 'cap', 'waiting'].map((c) => h('th', {}, c)))),
      h('tbody', {}, pool.study_list.map((s) => h('tr', {},
        h('td', {}, h('a', { href: '/studies/' + s.study_id }, s.study_id + ' ' + s.name)),
        h('td', {}, fmt(s.weight)), h('td', {}, s.running), h('td', {}, s.parallel_trials), h('td', {}, s.pending))))),
    h('h3', {}, 'Busy and idle slot-seconds per minute (last hour)'),
    h('div', { class: 'chart', id: 'usage-' + pool.name }));
}

async function drawUsage(pool) {
  if (!pool.usage.length) return;
  const Plotly = await plotly();
  const x = pool.usage.map((u) => u.minute);
  Plotly.react('usage-' + pool.name, [
    { type: 'bar', name: 'busy', x, y: pool.usage.map((u) => u.busy_slot_secs) },
    { type: 'bar', name: 'idle', x, y: pool.usage.map((u) => u.idle_slot_secs) },
  ], baseLayout({ barmode: 'stack', showlegend: true, height: 240 }), PLOT_CONFIG);
}
