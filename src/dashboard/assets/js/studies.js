// The studies page (`/`): every study with its state, progress, best value and tags, filtered
// by state, name and tag; the filter is kept in the URL.

import { api } from './api.js';
import { $, fmt, h, stateBadge } from './dom.js';
import { mark } from './marks.js';

const PAGE_SIZE = 1000;
/** Pages read at most: 20,000 studies. */
const MAX_PAGES = 20;
const COLUMNS = ['id', 'name', 'state', 'algorithm', 'progress', 'done / running / failed of max', 'best value', 'created'];

export async function studiesPage() {
  const params = new URLSearchParams(location.search);
  const stateFilter = h('select', { id: 'filter-state' },
    ['', 'active', 'completed', 'stopped', 'failed'].map((s) => h('option', { value: s }, s || 'any state')));
  stateFilter.value = params.get('state') || '';
  const nameFilter = h('input', { id: 'filter-name', placeholder: 'name contains', value: params.get('name') || '' });
  const tagFilter = h('input', { id: 'filter-tag', placeholder: 'tag', value: params.get('tag') || '' });
  const rows = h('tbody');
  const count = h('span', { class: 'muted', id: 'study-count' });
  $('#main').replaceChildren(
    h('h1', {}, 'Studies'),
    h('div', { class: 'card' },
      h('div', { class: 'bar' }, stateFilter, nameFilter, tagFilter, count),
      h('table', { class: 'plain', id: 'studies' },
        h('thead', {}, h('tr', {}, COLUMNS.map((c) => h('th', {}, c)))),
        rows)));

  // Filters change faster than answers come back: only the latest request draws.
  let latest = 0;
  async function load() {
    const request = ++latest;
    const query = new URLSearchParams();
    if (stateFilter.value) query.set('state', stateFilter.value);
    if (nameFilter.value.trim()) query.set('name', nameFilter.value.trim());
    const tag = tagFilter.value.trim();
    const shown = new URLSearchParams(query);
    if (tag) shown.set('tag', tag);
    history.replaceState(null, '', shown.toString() ? '/?' + shown : '/');
    // Tags are matched here, on the page: a study has a few, the list is read whole anyway.
    const studies = (await listStudies(query)).filter((s) => !tag || (s.tags || []).includes(tag));
    if (request !== latest) return;
    rows.replaceChildren(...studies.map(studyRow));
    count.textContent = studies.length + (studies.length === 1 ? ' study' : ' studies');
    mark('studies');
  }
  let typing = null;
  stateFilter.addEventListener('change', load);
  for (const input of [nameFilter, tagFilter]) input.addEventListener('input', () => { clearTimeout(typing); typing = setTimeout(load, 200); });
  // A click on a study's tag filters by it.
  rows.addEventListener('click', (e) => {
    const chip = e.target.closest('.tag');
    if (chip) { tagFilter.value = chip.textContent; load(); }
  });
  await load();
}

/** Every study matching the query, page by page. */
async function listStudies(query) {
  query.set('page_size', String(PAGE_SIZE));
  let studies = [];
  let token = null;
  for (let page = 0; page < MAX_PAGES; page++) {
    if (token) query.set('page_token', token);
    const r = await api('/v1/studies?' + query);
    studies = studies.concat(r.studies);
    token = r.next_page_token;
    if (!token) break;
  }
  return studies;
}

function studyRow(s) {
  const counts = s.trial_counts;
  const max = s.spec.max_trials || 1;
  const running = counts.requested + counts.active + counts.stopping;
  const failed = counts.failed + counts.infeasible;
  const share = (n) => Math.min(100, (100 * n) / max) + '%';
  const metric = s.spec.metrics[0];
  const best = s.best_trial && s.best_trial.final_measurement
    ? s.best_trial.final_measurement.metrics[metric.id] : null;
  return h('tr', { 'data-study': s.id },
    h('td', {}, s.id),
    h('td', {}, h('a', { href: '/studies/' + s.id }, s.name), ...(s.tags || []).map((t) => [' ', h('span', { class: 'tag', title: 'show the studies tagged ' + t }, t)])),
    h('td', {}, stateBadge(s.state)),
    h('td', {}, s.spec.algorithm),
    h('td', {}, h('div', { class: 'progress', title: `${counts.completed} done, ${running} running, ${failed} failed` },
      h('span', { class: 'done', style: 'width:' + share(counts.completed) }),
      h('span', { class: 'run', style: 'width:' + share(running) }),
      h('span', { class: 'fail', style: 'width:' + share(failed) }))),
    h('td', {}, `${counts.completed} / ${running} / ${failed} of ${max}`),
    h('td', { class: 'best' }, s.spec.metrics.length > 1
      ? h('span', { class: 'muted' }, 'Pareto set')
      : (best == null ? '' : `${fmt(best)} (${metric.id})`)),
    h('td', {}, new Date(s.created_at).toLocaleString()));
}
