// The trial page (`/studies/{study}/trials/{trial}`): parameters, outcome, learning curve;
// for dispatched trials the model directory and the tail of the log, of any replica of a
// cluster trial; for a running one, a terminal into it (`terminal.js`).

import { api, apiText } from './api.js';
import { PLOT_CONFIG, baseLayout, logScaleToggle, plotText, plotly, titled, yScale } from './charts.js';
import { annotationEditor, userAttrsTable } from './annotations.js';
import { $, fmt, h, keyValueTable, showError, stateBadge } from './dom.js';
import { mark } from './marks.js';
import { terminalCard } from './terminal.js';

const LOG_TAIL_BYTES = 65536;

export async function trialPage() {
  const study = Number(document.body.dataset.study);
  const trialId = Number(document.body.dataset.trial);
  const [info, trial] = await Promise.all([api(`/v1/studies/${study}`), api(`/v1/studies/${study}/trials/${trialId}`)]);
  document.title = `Trial ${trialId} · ${info.name} · Augur`;
  const job = info.spec.trial_job;
  const dir = job && job.output_dir ? `${studyDir(job, info)}/${trialId}` : null;
  const metrics = info.spec.metrics.map((m) => m.id);
  // Cards a trial may lack come as null: left out (replaceChildren would write "null").
  $('#main').replaceChildren(...[
    h('h1', {}, h('a', { href: `/studies/${study}` }, info.name), ` › trial ${trialId} `, stateBadge(trial.state),
      trial.early_stopped ? h('span', { class: 'muted' }, ' stopped early') : null,
      tensorboardLink(info, trialId)),
    h('div', { class: 'grid2' },
      h('div', { class: 'card' }, h('h2', {}, 'Parameters'),
        h('div', { id: 'trial-params' }, keyValueTable(Object.entries(trial.parameters).map(([k, v]) => [k, fmt(v)])))),
      h('div', { class: 'card' }, h('h2', {}, 'Outcome'), h('div', { id: 'trial-outcome' }, keyValueTable(outcome(trial, metrics))))),
    trial.lineage ? lineageCard(study, trial) : null,
    h('div', { class: 'card' }, h('h2', {}, 'Learning curve'), h('div', { class: 'bar' }, logScaleToggle('chart-trial-curve')), h('div', { id: 'chart-trial-curve', class: 'chart' })),
    h('div', { class: 'grid2' },
      h('div', { class: 'card' }, h('h2', {}, 'Note and tags'), annotationEditor(`/v1/studies/${study}/trials/${trialId}`, trial, 'trial')),
      h('div', { class: 'card' }, h('h2', {}, 'User attributes'), h('div', { id: 'trial-user-attrs' }, userAttrsTable(trial.user_attrs)))),
    h('div', { class: 'grid2' },
      h('div', { class: 'card' }, h('h2', {}, 'Artifacts'), h('div', { class: 'placeholder', id: 'model-dir' },
        dir ? `${dir}/model (checkpoints in ${dir}/checkpoints)` : 'Shown here once the study dispatches its trials (trial_job.output_dir).'),
      h('div', { id: 'artifacts' })),
      h('div', { class: 'card' }, h('h2', {}, 'Logs'), h('div', { class: 'placeholder', id: 'logs' },
        dir ? `${dir}/logs` : 'stdout and stderr appear here once the study dispatches its trials.'))),
    job && runsHere(trial) ? terminalCard(study, trialId, replicaNames(job)) : null,
  ].filter(Boolean));
  mark('trial');
  if (job) {
    showLogs(study, trialId, replicaNames(job));
    showArtifacts(study, trialId).catch((e) => { $('#artifacts').replaceChildren(h('p', { class: 'error' }, String(e.message || e))); });
  }
  await drawLearningCurve(trial, metrics);
}

/** Whether a session can open in the trial: running, and run by this server's dispatcher
 * (a pulled trial runs on its client's machine; `service/exec.rs`). */
const runsHere = (trial) => (trial.state === 'active' || trial.state === 'stopping') && trial.client_id === 'augur-dispatcher';

/** A link to the TensorBoard `augur tensorboard` runs over the study (it names itself in
 * the study's user attribute `augur:tensorboard_url` while it runs), whose run for this trial
 * is `trial-<id>`; only an http(s) address is a link. */
function tensorboardLink(info, trialId) {
  const url = (info.user_attrs || {})['augur:tensorboard_url'];
  if (typeof url !== 'string' || !/^https?:\/\//i.test(url)) return null;
  return h('a', { id: 'tensorboard-link', class: 'tensorboard-link', href: url, target: '_blank', rel: 'noopener noreferrer',
    title: `TensorBoard: this trial is the run trial-${trialId}` }, 'TensorBoard ↗');
}

/** Where a study's trial directories are in its output_dir (`model/trial_dirs.rs`): named by
 * the study's id and when it was made (UTC, to the millisecond). */
function studyDir(job, info) {
  if (job.output_layout === 'trial') return job.output_dir;
  if (job.output_layout === 'study_id') return `${job.output_dir}/study-${info.id}`;
  const created = new Date(info.created_at).toISOString().slice(0, 23).replace(/[-:]/g, '');
  return `${job.output_dir}/study-${info.id}-${created}`;
}

/** The outcome's rows: final metrics, state, client, times and any reason. */
function outcome(trial, metrics) {
  const finals = trial.final_measurement ? trial.final_measurement.metrics : {};
  const time = (t) => (t ? new Date(t).toLocaleString() : '');
  return [
    ...metrics.map((m) => [m, fmt(finals[m])]),
    ['state', trial.state], ['client', trial.client_id || ''],
    ...(trial.budget != null ? [['budget', fmt(trial.budget)]] : []),
    ['created', new Date(trial.created_at).toLocaleString()],
    ['started', time(trial.started_at)],
    ['completed', time(trial.completed_at)],
    ...(trial.infeasible_reason ? [['infeasible', trial.infeasible_reason]] : []),
    ...(trial.fail_reason ? [['failure', trial.fail_reason]] : []),
    ...(trial.excluded ? [['excluded', 'hidden from the optimizer']] : []),
  ];
}

/**
 * PBT's lineage: the values of each segment, from which budget on, and whose checkpoint it
 * started from (a link to that trial, whose page shows its own lineage: the parent chain).
 */
function lineageCard(study, trial) {
  const names = [...new Set(trial.lineage.segments.flatMap((s) => Object.keys(s.parameters)))];
  const rows = trial.lineage.segments.map((s) => h('tr', {},
    h('td', {}, fmt(s.from_budget)),
    h('td', {}, s.parent != null ? h('a', { href: `/studies/${study}/trials/${s.parent}` }, `trial ${s.parent}`) : 'its own start'),
    ...names.map((n) => h('td', {}, fmt(s.parameters[n])))));
  return h('div', { class: 'card' }, h('h2', {}, 'Lineage (PBT)'),
    h('table', { class: 'plain', id: 'trial-lineage' },
      h('thead', {}, h('tr', {}, h('th', {}, 'from budget'), h('th', {}, 'checkpoint from'), ...names.map((n) => h('th', {}, n)))),
      h('tbody', {}, rows)),
    trial.lineage.copying_from != null ? h('p', { class: 'muted' }, `copying trial ${trial.lineage.copying_from}'s checkpoint`) : null);
}

/**
 * The files the trial's job left in its model (or checkpoint) directory, each a download
 * link; the server lists no links and follows none.
 */
async function showArtifacts(study, trialId) {
  const box = $('#artifacts');
  const root = h('select', { id: 'artifact-root' }, h('option', { value: 'model' }, 'model'), h('option', { value: 'checkpoints' }, 'checkpoints'));
  const list = h('div', {});
  const load = async () => {
    const base = `/v1/studies/${study}/trials/${trialId}/artifacts`;
    const got = await api(`${base}?root=${root.value}`);
    const link = (path) => `${base}/content?root=${root.value}&path=${encodeURIComponent(path)}`;
    list.replaceChildren(...[got.files.length
      ? h('table', { class: 'plain files', id: 'artifact-list' }, h('tbody', {}, got.files.map((f) => h('tr', {},
        h('td', {}, h('a', { href: link(f.path), download: f.path.split('/').pop() }, f.path)),
        h('td', { class: 'size' }, bytes(f.size)),
        h('td', { class: 'muted' }, new Date(f.modified).toLocaleString())))))
      : h('p', { class: 'muted' }, `No files in ${got.directory} yet.`),
    got.truncated ? h('p', { class: 'muted' }, 'More files than shown.') : null].filter(Boolean));
  };
  root.addEventListener('change', () => load().catch(showError));
  box.replaceChildren(h('div', { class: 'bar' }, 'Directory', root), list);
  await load();
}

/** A size in bytes, KiB, MiB or GiB. */
function bytes(n) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

/** The replicas of a cluster trial (`workerpool1-2`), the primary first; `null` pools are skipped. */
export function replicaNames(job) {
  const pools = job.worker_pools || [];
  if (!pools.length) return ['workerpool0-0'];
  return pools.flatMap((pool, p) => (pool ? Array.from({ length: pool.replicas ?? 1 }, (_, i) => `workerpool${p}-${i}`) : []));
}

/** Dispatched trials keep stdout and stderr on the server: show the tail, of a chosen replica. */
function showLogs(study, trialId, replicas) {
  const pre = h('pre', { class: 'log', id: 'log-text' }, '');
  const choose = replicas.length > 1
    ? h('select', { id: 'log-replica' }, ...replicas.map((r) => h('option', { value: r }, r === 'workerpool0-0' ? `${r} (primary)` : r)))
    : null;
  const load = (replica) => {
    const which = replica === 'workerpool0-0' ? '' : `&replica=${encodeURIComponent(replica)}`;
    apiText(`/v1/studies/${study}/trials/${trialId}/logs?tail_bytes=${LOG_TAIL_BYTES}${which}`)
      .then((log) => { if (log != null) pre.textContent = log || '(empty so far)'; })
      .catch(() => {});
  };
  if (choose) choose.addEventListener('change', () => load(choose.value));
  $('#logs').replaceChildren(...(choose ? [choose] : []), pre);
  load(replicas[0]);
}

/** One line per metric over the reported steps. */
async function drawLearningCurve(trial, metrics) {
  if (!trial.measurements.length) {
    $('#chart-trial-curve').replaceChildren(h('p', { class: 'muted' }, 'No intermediate values reported.'));
    return;
  }
  const P = await plotly();
  await P.react('chart-trial-curve', metrics.map((m) => {
    const reported = trial.measurements.filter((x) => x.metrics[m] != null);
    return { x: reported.map((x) => x.step), y: reported.map((x) => x.metrics[m]), mode: 'lines+markers', type: 'scatter', name: plotText(m) };
  }), baseLayout({ showlegend: metrics.length > 1, xaxis: titled('step'), yaxis: { type: yScale('chart-trial-curve') } }), PLOT_CONFIG);
  mark('charts');
}
