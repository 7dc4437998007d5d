// The trial page's terminal (`assets/js/terminal.js`) in headless Chromium against a live
// `augur serve` that requires tokens: a study whose trial (a local job that waits) runs; the
// browser is signed in with the admin's token (the cookie), which alone opens no session; a
// reader's pasted token is refused with the server's reason; the study's creator's token opens
// a shell into the trial, whose own AUGUR_TRIAL_ID comes back in the terminal's rows, on a
// remote terminal of the panel's size that follows it; closing the panel kills the shell;
// `exit` ends a session with its status, and the finished trial's page has no terminal. The
// token stays in the tab's sessionStorage only. Screenshots go to $ARTIFACTS.
//
// usage: node terminal.mjs <base url> <admin token> <output dir for the study's trials>
import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

const [base, ADMIN, runs] = process.argv.slice(2);
const ARTIFACTS = process.env.ARTIFACTS || 'target/browser-artifacts';
mkdirSync(ARTIFACTS, { recursive: true });

async function api(token, method, path, body) {
  const r = await fetch(base + path, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const json = await r.json().catch(() => null);
  if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${JSON.stringify(json)}`);
  return json;
}

function assert(cond, message) { if (!cond) throw new Error('assertion failed: ' + message); }
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function eventually(what, fn, ms = 30000) {
  const deadline = Date.now() + ms;
  let last;
  while (Date.now() < deadline) {
    try {
      const got = await fn();
      if (got) return got;
    } catch (e) { last = e; }
    await sleep(200);
  }
  throw new Error(`${what} within ${ms} ms${last ? `: ${last.message}` : ''}`);
}

const results = [];
async function test(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    results.push([name, true]);
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    results.push([name, false]);
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

// The study's creator (an operator: a trial_job needs one) and a reader.
const owner = (await api(ADMIN, 'POST', '/v1/tokens', { name: 'terminal-owner', role: 'operator' })).token;
const reader = (await api(ADMIN, 'POST', '/v1/tokens', { name: 'terminal-reader', role: 'reader' })).token;
const study = (await api(owner, 'POST', '/v1/studies', {
  name: 'terminal', algorithm: 'random', metrics: [{ id: 'loss', goal: 'minimize' }],
  parameters: [{ id: 'x', type: 'double', min: 0, max: 1 }], max_trials: 1, parallel_trials: 1, seed: 1,
  // Waits for a file a session makes (at most 5 minutes), then reports.
  trial_job: {
    command: ['/bin/sh', '-c', 'i=0; while [ ! -f "$AIP_MODEL_DIR/done" ] && [ $i -lt 1500 ]; do sleep 0.2; i=$((i+1)); done; echo loss=1'],
    output_dir: runs,
  },
})).id;
const trialPath = `/v1/studies/${study}/trials/1`;
await eventually('trial 1 running', async () => (await api(ADMIN, 'GET', trialPath)).state === 'active');
// Its job has started once its handle is written; a session opens from then on.
await eventually('a session opening in trial 1', async () => {
  const r = await fetch(`${base}${trialPath}/exec`, { headers: { authorization: `Bearer ${owner}` } });
  return r.status === 400; // every check passed; only the upgrade is missing
});

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
const page = await context.newPage();
page.on('pageerror', (e) => console.log('page error:', e.message));
const shot = (name) => page.screenshot({ path: join(ARTIFACTS, name), fullPage: true });
const rows = () => page.locator('#terminal-screen .xterm-rows').innerText();
const status = () => page.locator('#terminal-status').innerText();

// Signed in as the admin: the cookie reads every page, and would do anything if it could.
await page.goto(`${base}/login?next=${encodeURIComponent(`/studies/${study}/trials/1`)}`);
await page.fill('input[name=token]', ADMIN);
await page.click('button[type=submit]');
await page.waitForSelector('#terminal-card');

/** Pastes `token`, opens a terminal and waits until the session is connected or refused. */
async function openWith(token, command = '') {
  await page.fill('#terminal-token', token);
  await page.fill('#terminal-command', command);
  await page.click('#terminal-open');
  await page.waitForFunction(() => !/connecting/.test(document.querySelector('#terminal-status').textContent));
}

await test('the sign-in cookie alone opens no session', async () => {
  const lines = (await page.locator('#main').innerText()).split('\n');
  assert(!lines.includes('null'), 'a card the trial lacks is left out, not written "null"');
  await openWith('');
  const said = await status();
  assert(/paste an API token/.test(said), `status: ${said}`);
  assert(await page.locator('#terminal-open').isVisible(), 'the open button is back');
});

await test("a reader's token is refused with the server's reason", async () => {
  await openWith(reader);
  const said = await status();
  assert(/refused, 403/.test(said) && /writer/.test(said), `status: ${said}`);
});

let shellPid;
await test("the creator's token opens a shell in the trial: its own AUGUR_TRIAL_ID comes back, on a terminal of the panel's size", async () => {
  await openWith(owner);
  assert(/connected to workerpool0-0/.test(await status()), `status: ${await status()}`);
  await page.locator('#terminal-screen .xterm').click();
  await page.keyboard.type('echo "trial=$AUGUR_TRIAL_ID study=$AUGUR_STUDY_ID pid=$$"');
  await page.keyboard.press('Enter');
  const seen = await eventually('the trial\'s id in the terminal', async () => {
    const text = await rows();
    return text.includes(`trial=1 study=${study} pid=`) ? text : null;
  }, 15000);
  shellPid = Number(seen.match(new RegExp(`trial=1 study=${study} pid=(\\d+)`))[1]);
  assert(shellPid > 0, `the shell's pid in ${seen}`);
  // The remote terminal has the panel's size, and follows it.
  const stty = async (size) => {
    await page.keyboard.type('stty size');
    await page.keyboard.press('Enter');
    await eventually(`stty size ${size.rows} ${size.cols}`, async () => (await rows()).includes(`\n${size.rows} ${size.cols}\n`), 15000);
  };
  const before = await page.evaluate(() => window.augur.terminal);
  await stty(before);
  await page.setViewportSize({ width: 900, height: 1000 });
  const after = await eventually('the terminal resized', async () => {
    const size = await page.evaluate(() => window.augur.terminal);
    return size.cols < before.cols ? size : null;
  }, 10000);
  await page.keyboard.type('clear');
  await page.keyboard.press('Enter');
  await stty(after);
  console.log(`     remote terminal ${before.rows}x${before.cols}, then ${after.rows}x${after.cols} with the window narrower`);
  await page.setViewportSize({ width: 1400, height: 1000 });
  await shot('terminal.png');
  // The token is this tab's: in sessionStorage, not in localStorage nor any cookie script can read.
  const kept = await page.evaluate(() => ({
    session: sessionStorage.getItem('augur.terminal.token'), local: localStorage.length, cookie: document.cookie,
  }));
  assert(kept.session === owner && kept.local === 0 && !kept.cookie.includes(owner), JSON.stringify(kept));
});

await test("closing the panel ends the session and kills its shell", async () => {
  await page.click('#terminal-close');
  assert(await page.locator('#terminal-screen').isHidden(), 'the terminal is hidden');
  await eventually(`shell ${shellPid} gone`, async () => {
    try { process.kill(shellPid, 0); return false; } catch (e) { return e.code === 'ESRCH'; }
  }, 15000);
});

await test('`exit` ends a session with its status, shown on the page', async () => {
  await openWith(owner);
  await page.locator('#terminal-screen .xterm').click();
  await page.keyboard.type('touch "$AIP_MODEL_DIR/done"; exit 3');
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => /exited with status 3/.test(document.querySelector('#terminal-status').textContent), null, { timeout: 15000 });
  assert((await rows()).includes('[session exited with status 3]'), await rows());
  assert(await page.locator('#terminal-open').isVisible(), 'the open button is back');
  await shot('terminal-exit.png');
  // The session touched what the trial waits for: it completes.
  await eventually('trial 1 completed', async () => (await api(ADMIN, 'GET', trialPath)).state === 'completed');
  // A finished trial's page has no terminal.
  await page.reload();
  await page.waitForSelector('#trial-outcome');
  assert(await page.locator('#terminal-card').count() === 0, 'no terminal on a finished trial');
});

// Every session opened is in the audit trail, as the creator's: never the admin's cookie.
await test("the sessions are in the audit trail as the creator's", async () => {
  const events = (await api(ADMIN, 'GET', '/v1/audit')).events.filter((e) => e.action === 'trial.exec');
  assert(events.length === 2 && events.every((e) => e.actor === 'terminal-owner'), JSON.stringify(events));
});

await browser.close();
const failed = results.filter(([, ok]) => !ok);
console.log(`terminal: ${results.length - failed.length} passed, ${failed.length} failed`);
process.exit(failed.length ? 1 : 0);
