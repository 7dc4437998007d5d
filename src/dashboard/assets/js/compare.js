// The compare page (`/compare?studies=1,2`): studies side by side, their best-so-far curves on
// one chart and their best trials' parameters in one table.

import { api } from './api.js';
import { PLOT_CONFIG, baseLayout, plotText, plotly, titled } from './charts.js';
import { $, fmt, h } from './dom.js';
import { mark } from './marks.js';

const MAX_STUDIES = 12;

export async function comparePage() {
  const ids = (new URLSearchParams(location.search).get('studies') || '').split(',')
    .map((s) => s.trim()).filter((s) => /^\d+$/.test(s)).slice(0, MAX_STUDIES);
  const input = h('input', { id: 'compare-ids', placeholder: 'study ids, e.g. 1,2', value: ids.join(',') });
  const form = h('form', {
    class: 'bar',
    onsubmit: (e) => { e.preventDefault(); location.href = '/compare?studies=' + encodeURIComponent(input.value.replace(/\s+/g, '')); },
  }, 'Studies', input, h('button', { type: 'submit' }, 'Compare'));
  $('#main').replaceChildren(h('h1', {}, 'Compare studies'), h('div', { class: 'card' }, form));
  if (ids.length === 0) { $('#main').append(h('p', { class: 'muted' }, 'Name two or more studies to compare.')); return; }

  const studies = await Promise.all(ids.map(async (id) => {
    const [info, insights] = await Promise.all([api(`/v1/studies/${id}`), api(`/v1/studies/${id}/insights`)]);
    return { info, insights };
  }));
  const bestParams = await Promise.all(studies.map(({ info, insights }) => (insights.best
    ? api(`/v1/studies/${info.id}/trials/${insights.best.trial}`).then((t) => t.parameters)
    : Promise.resolve({}))));
  $('#main').append(
    h('div', { class: 'card' }, h('h2', {}, 'Best so far'), h('div', { id: 'chart-compare', class: 'chart' })),
    h('div', { class: 'card' }, h('h2', {}, 'Best trials'), bestTrialsTable(studies, bestParams)));
  mark('compare');
  await drawBestSoFar(studies);
  mark('charts');
}

/** One row per study: its metric, best value and trial, and the best trial's parameters. */
function bestTrialsTable(studies, bestParams) {
  const paramNames = [...new Set(studies.flatMap(({ insights }) => insights.parameters.map((p) => p.id)))];
  return h('table', { class: 'plain', id: 'compare-table' },
    h('thead', {}, h('tr', {}, ['study', 'metric', 'best value', 'trial', 'completed', ...paramNames].map((c) => h('th', {}, c)))),
    h('tbody', {}, studies.map(({ info, insights }, k) => h('tr', { 'data-study': info.id },
      h('td', {}, h('a', { href: '/studies/' + info.id }, `#${info.id} ${info.name}`)),
      h('td', {}, `${insights.metric.id} (${insights.metric.goal})`),
      h('td', { class: 'best' }, insights.best ? fmt(insights.best.value) : '–'),
      h('td', {}, insights.best ? h('a', { href: `/studies/${info.id}/trials/${insights.best.trial}` }, '#' + insights.best.trial) : '–'),
      h('td', {}, insights.completed),
      paramNames.map((p) => h('td', {}, fmt(bestParams[k][p])))))));
}

/** Each study's best-so-far steps, carried on to its last trial. */
async function drawBestSoFar(studies) {
  const P = await plotly();
  await P.react('chart-compare', studies.map(({ info, insights }) => {
    const history = insights.history;
    const x = history.best_trial.slice();
    const y = history.best_value.slice();
    if (x.length) { x.push(history.last_trial); y.push(y[y.length - 1]); }
    return { x, y, mode: 'lines', type: 'scatter', line: { shape: 'hv', width: 2 }, name: plotText(`#${info.id} ${info.name} (${insights.metric.id})`) };
  }), baseLayout({ showlegend: true, legend: { orientation: 'h', y: -0.2 }, xaxis: titled('trial'), yaxis: titled('best so far') }), PLOT_CONFIG);
}
