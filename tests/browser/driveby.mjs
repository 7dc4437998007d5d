// The drive-by attack of the security probe, played by headless Chromium against a live
// `augur serve` running open (loopback, no token: the README's default):
//  1. a page of another site (http://evil.example:<port>, resolved to 127.0.0.1 by Chromium's
//     host rules) posts a study with a `trial_job` to the server with
//     fetch({mode: 'no-cors', body: Blob}) and as text/plain: no preflight asks first;
//  2. DNS rebinding: the same name re-pointed at the server's own port makes the page
//     "same origin" with it, so it posts with Content-Type application/json.
// The test passes when the server created nothing and the job's command never ran.
//
// usage: node driveby.mjs <augur base url> <marker file the attack's command would create>
import { chromium } from 'playwright-core';
import { createServer } from 'node:http';
import { existsSync } from 'node:fs';

const [base, marker] = process.argv.slice(2);
const augurPort = new URL(base).port;

const spec = {
  name: 'drive-by',
  algorithm: 'random',
  metrics: [{ id: 'loss', goal: 'minimize' }],
  parameters: [{ id: 'x', type: 'double', min: 0, max: 1 }],
  max_trials: 1,
  parallel_trials: 1,
  trial_job: { command: ['sh', '-c', `touch '${marker}'`] },
};

// The attacker's page, served from another origin.
const page = `<!doctype html><title>cute cats</title><script>
const spec = ${JSON.stringify(JSON.stringify(spec))};
(async () => {
  const target = 'http://127.0.0.1:${augurPort}/v1/studies';
  const tries = [
    fetch(target, { mode: 'no-cors', method: 'POST', body: new Blob([spec]) }),
    fetch(target, { mode: 'no-cors', method: 'POST', headers: { 'content-type': 'text/plain' }, body: spec }),
  ];
  await Promise.allSettled(tries);
  document.title = 'sent';
})();
</script>`;
const attacker = createServer((req, res) => {
  res.writeHead(200, { 'content-type': 'text/html' });
  res.end(page);
});
await new Promise((resolve) => attacker.listen(0, '127.0.0.1', resolve));
const attackerPort = attacker.address().port;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--host-resolver-rules=MAP evil.example 127.0.0.1'],
});
let failures = 0;
const check = (ok, what) => {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`);
  if (!ok) failures += 1;
};
try {
  const tab = await browser.newPage();
  // 1. A foreign page's simple requests.
  await tab.goto(`http://evil.example:${attackerPort}/`);
  await tab.waitForFunction(() => document.title === 'sent', null, { timeout: 10000 });

  // 2. DNS rebinding: evil.example now resolves to the server itself.
  await tab.goto(`http://evil.example:${augurPort}/`).catch(() => {});
  const rebound = await tab.evaluate(async (spec) => {
    const r = await fetch('/v1/studies', { method: 'POST', headers: { 'content-type': 'application/json' }, body: spec });
    const read = await fetch('/v1/studies');
    return { write: r.status, read: read.status };
  }, JSON.stringify(spec));
  check(rebound.write === 403 && rebound.read === 403,
    `a rebound name is refused, writes and reads (got ${JSON.stringify(rebound)})`);

  // Whatever got through would be running by now (the dispatcher reacts at once).
  await new Promise((resolve) => setTimeout(resolve, 3000));
  const studies = await (await fetch(`${base}/v1/studies`)).json();
  check(studies.studies.length === 0, `no study was created (found ${studies.studies.map((s) => s.name)})`);
  check(!existsSync(marker), `the attack's command never ran (${marker})`);
} finally {
  await browser.close();
  attacker.close();
}
if (failures > 0) {
  console.log(`${failures} drive-by check(s) failed`);
  process.exit(1);
}
console.log('drive-by: the server refused every request');
