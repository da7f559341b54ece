// The Web UI in real Chromium against a running svc (driven by svc-bins/tests/e2e_web_ui.rs).
//
// Environment (all required):
//   SVC_WEB_URL         the proxy's web address, e.g. https://127.0.0.1:3080
//   SVC_WEB_ARTEFACTS   directory for the screenshots (created if missing)
//   SVC_VIEWER, SVC_VIEWER_PASS   a user who may read the maintenance window but not change it
//   SVC_EDITOR, SVC_EDITOR_PASS   a user who may change it
//   SVC_LOCAL_NODE      the all-in-one process's node name
//   SVC_AGENT           the joined agent's node name; SVC_AGENT_HOST_ID its host ID (UUID)
//   SVC_LOGIN           the login the users have on nodes
//   SVC_APP             an HTTP app that echoes the request's headers in its page
//   SVC_PUBLIC_HOST     the proxy's public host: apps are its subdomains, resolved to 127.0.0.1
//   SVC_CHROMIUM        the browser (default /usr/bin/chromium)
//   SVC_SSO_DISPLAY, SVC_SSO_USER   optional: a connector's display name, whose button on the
//                       sign-in page signs the provider's user SVC_SSO_USER in without a prompt
// Prints one line per step; exits 1 naming the failed step, with the page's console errors.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import https from 'node:https';
import { chromium } from 'playwright-core';

function env(name, fallback) {
  const v = process.env[name] ?? fallback;
  if (v === undefined || v === '') {
    console.error(`missing environment variable ${name}`);
    process.exit(2);
  }
  return v;
}

const BASE = env('SVC_WEB_URL').replace(/\/$/, '');
const ARTEFACTS = env('SVC_WEB_ARTEFACTS');
const VIEWER = env('SVC_VIEWER');
const VIEWER_PASS = env('SVC_VIEWER_PASS');
const EDITOR = env('SVC_EDITOR');
const EDITOR_PASS = env('SVC_EDITOR_PASS');
const LOCAL_NODE = env('SVC_LOCAL_NODE');
const AGENT = env('SVC_AGENT');
const AGENT_HOST_ID = env('SVC_AGENT_HOST_ID');
const LOGIN = env('SVC_LOGIN');
const APP = env('SVC_APP');
const PUBLIC_HOST = env('SVC_PUBLIC_HOST');
const CHROMIUM = env('SVC_CHROMIUM', '/usr/bin/chromium');
const SSO_DISPLAY = process.env.SVC_SSO_DISPLAY || '';
const SSO_USER = SSO_DISPLAY ? env('SVC_SSO_USER') : '';
// Every wait has a deadline (a loaded 2-core CI machine running a debug build).
const TIMEOUT = 30_000;

const CSP =
  "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

fs.mkdirSync(ARTEFACTS, { recursive: true });
if (!fs.existsSync(CHROMIUM)) {
  console.error(`${CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)`);
  process.exit(2);
}

let step = 'start';
function say(text) {
  step = text;
  console.log(`step: ${text}`);
}
function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

// Console errors and uncaught exceptions of every page. The browser logs each 4xx answer as a
// console error ("Failed to load resource"): those of the web API that the scenario provokes on
// purpose (the sign-in page's session probe answering 401, the refused save answering 403) are
// expected; any other console error fails the test.
const consoleErrors = [];
const expectedApiErrors = [];
function watch(page) {
  page.on('console', (msg) => {
    if (msg.type() !== 'error') return;
    const text = msg.text();
    const url = msg.location()?.url || '';
    const api = /Failed to load resource: the server responded with a status of (\d+)/.exec(text);
    if (api && url.startsWith(`${BASE}/webapi/`)) {
      const status = Number(api[1]);
      const route = new URL(url).pathname;
      if ((status === 401 && route === '/webapi/sessions/web') || (status === 403 && route === '/webapi/maintenance')) {
        expectedApiErrors.push(`${status} ${route}`);
        return;
      }
    }
    consoleErrors.push(`${page.url()}: console error: ${text} (${url})`);
  });
  page.on('pageerror', (err) => consoleErrors.push(`${page.url()}: uncaught: ${err.message}`));
}

// The page the scenario is on, for a screenshot when a step fails.
let current = null;

async function shot(page, name) {
  current = page;
  const file = path.join(ARTEFACTS, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  console.log(`screenshot: ${file}`);
}

async function signIn(page, user, pass) {
  await page.goto(`${BASE}/`, { timeout: TIMEOUT });
  await page.waitForURL(`${BASE}/web/login`, { timeout: TIMEOUT });
  await page.getByLabel('User name').fill(user);
  await page.getByLabel('Password').fill(pass);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.waitForURL(`${BASE}/web/resources`, { timeout: TIMEOUT });
  await page.locator('#who').filter({ hasText: user }).waitFor({ timeout: TIMEOUT });
}

/** GET `route` on the proxy with `cookie` outside the browser: the status code. */
function statusWithCookie(route, cookie) {
  return new Promise((resolve, reject) => {
    const req = https.request(
      `${BASE}${route}`,
      { method: 'GET', headers: { Cookie: cookie }, rejectUnauthorized: false, timeout: TIMEOUT },
      (res) => {
        res.resume();
        resolve(res.statusCode);
      },
    );
    req.on('timeout', () => req.destroy(new Error(`GET ${route}: no answer within ${TIMEOUT} ms`)));
    req.on('error', reject);
    req.end();
  });
}

async function main() {
  const userData = fs.mkdtempSync(path.join(os.tmpdir(), 'svc-web-ui-chromium-'));
  // A fresh profile every run (Playwright passes it to Chromium as --user-data-dir).
  const context = await chromium.launchPersistentContext(userData, {
    executablePath: CHROMIUM,
    timeout: TIMEOUT,
    // The proxy's certificate is the cluster's own (not in the browser's store).
    ignoreHTTPSErrors: true,
    viewport: { width: 1280, height: 800 },
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      // Apps live on subdomains of the proxy's public host, which only this browser resolves.
      `--host-resolver-rules=MAP ${PUBLIC_HOST} 127.0.0.1, MAP *.${PUBLIC_HOST} 127.0.0.1`,
    ],
  });
  try {
    context.setDefaultTimeout(TIMEOUT);
    context.on('page', watch);
    for (const p of context.pages()) watch(p);
    const page = context.pages()[0] ?? (await context.newPage());
    current = page;

    say('the root redirects to /web/ with the security headers');
    const resp = await page.goto(`${BASE}/`, { timeout: TIMEOUT });
    check(resp && resp.ok(), `GET / answered ${resp && resp.status()}`);
    const headers = resp.headers();
    check(new URL(resp.url()).pathname === '/web/', `redirected to ${resp.url()}`);
    check(headers['content-security-policy'] === CSP, `CSP header: ${headers['content-security-policy']}`);
    check(headers['x-frame-options'] === 'DENY', 'X-Frame-Options');
    check(headers['x-content-type-options'] === 'nosniff', 'X-Content-Type-Options');
    check(headers['referrer-policy'] === 'no-referrer', 'Referrer-Policy');
    await page.waitForURL(`${BASE}/web/login`);
    await shot(page, '01-sign-in');

    say('keyboard: the sign-in page focuses the user name; Shift+Tab reaches the skip link, focus visible');
    await page.waitForFunction(() => document.activeElement?.id === 'login-user');
    await page.keyboard.press('Shift+Tab');
    const focused = await page.evaluate(() => ({
      text: document.activeElement?.textContent,
      outline: getComputedStyle(document.activeElement).outlineStyle,
    }));
    check(focused.text === 'Skip to content', `focus after Shift+Tab: ${focused.text}`);
    check(focused.outline !== 'none', `focus outline: ${focused.outline}`);
    await page.keyboard.press('Tab');

    say('a wrong password is refused with the server\'s reason');
    await page.getByLabel('User name').fill(VIEWER);
    await page.getByLabel('Password').fill(`${VIEWER_PASS}-wrong`);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('alert').filter({ hasText: 'Sign-in failed' }).waitFor();

    say(`sign in as ${VIEWER}`);
    await page.getByLabel('Password').fill(VIEWER_PASS);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.waitForURL(`${BASE}/web/resources`);

    say('resources: the local node and the agent, with labels');
    await page.locator(`tr[data-name="${LOCAL_NODE}"]`).waitFor();
    await page.locator(`tr[data-name="${AGENT}"]`).waitFor();
    await shot(page, '02-resources');
    say('resources: search narrows the list');
    await page.getByLabel('Search by name, hostname or label').fill(AGENT);
    await page.getByRole('button', { name: 'Search' }).click();
    await page.locator(`tr[data-name="${LOCAL_NODE}"]`).waitFor({ state: 'detached' });
    await page.locator(`tr[data-name="${AGENT}"]`).waitFor();
    await page.getByLabel('Search by name, hostname or label').fill('');
    await page.getByRole('button', { name: 'Search' }).click();
    await page.locator(`tr[data-name="${LOCAL_NODE}"]`).waitFor();

    say('inventory: the agent with its version and upgrader');
    await page.getByRole('link', { name: 'Inventory' }).click();
    await page.waitForURL(/\/web\/inventory/);
    const agentRow = page.locator('#inventory tbody tr').filter({ has: page.getByRole('rowheader', { name: AGENT, exact: true }) });
    await agentRow.waitFor();
    const cells = await agentRow.locator('td, th').allInnerTexts();
    console.log(`inventory row: ${JSON.stringify(cells)}`);
    check(cells[0].includes(AGENT_HOST_ID), `host ID cell ${cells[0]}`);
    check(cells[1] === AGENT, `hostname cell ${cells[1]}`);
    check(/v?\d+\.\d+\.\d+/.test(cells[3]), `version cell ${cells[3]}`);
    check(/^(unit|kube|none)/.test(cells[4]), `upgrader cell ${cells[4]}`);
    const summary = await page.locator('#inventory-results .summary').innerText();
    check(/Cluster version v?\d+\.\d+\.\d+/.test(summary), `summary: ${summary}`);
    await shot(page, '03-inventory');
    say('inventory: filters as tctl inventory ls');
    await page.getByLabel('Exact version').fill('0.0.1');
    await page.getByRole('button', { name: 'Apply filters' }).click();
    await page.getByText('No agent matches these filters.').waitFor();
    check(page.url().includes('exact_version=0.0.1'), `filter in the URL: ${page.url()}`);
    await page.getByRole('button', { name: 'Clear' }).click();
    await agentRow.waitFor();

    say('maintenance: the viewer sees the window');
    await page.getByRole('link', { name: 'Maintenance' }).click();
    await page.locator('#maintenance-current').filter({ hasText: '04:00 UTC' }).waitFor();
    await shot(page, '04-maintenance-viewer');
    say('maintenance: the viewer cannot save it, and the page says why');
    await page.getByLabel('Start hour').selectOption('9');
    await page.getByRole('button', { name: 'Save' }).click();
    const refusal = page.getByRole('alert').filter({ hasText: 'refused' });
    await refusal.waitFor();
    const why = await refusal.innerText();
    console.log(`refusal: ${why}`);
    check(/denied|not allowed|permission/i.test(why), `the refusal gives the server's reason: ${why}`);
    await shot(page, '05-maintenance-refused');

    say('version channels');
    await page.getByRole('link', { name: 'Version channels' }).click();
    await page.locator('#channels, .notice').first().waitFor();
    await page.getByRole('heading', { name: 'Version channels' }).waitFor();
    await page.waitForFunction(() => !document.querySelector('main')?.textContent?.includes('Loading'));
    check(!(await page.getByRole('alert').count()), 'the channels page shows no error');
    await shot(page, '06-channels');

    say(`terminal: a shell on ${AGENT} as ${LOGIN}`);
    await page.getByRole('link', { name: 'Resources' }).click();
    const row = page.locator(`tr[data-name="${AGENT}"]`);
    await row.waitFor();
    await row.getByRole('combobox').selectOption(LOGIN);
    await row.getByRole('button', { name: /Connect/ }).click();
    await page.waitForURL(/\/web\/terminal\?/);
    await page.locator('#terminal[data-connected="true"]').waitFor();
    await page.locator('#terminal .xterm-helper-textarea').focus();
    await page.keyboard.type('echo web-$((6*7)) ünïcødé\r');
    await page.locator('#terminal .xterm-rows').filter({ hasText: 'web-42 ünïcødé' }).waitFor();
    say('terminal: resize reaches the shell');
    const sizes = async () =>
      (await page.locator('#terminal .xterm-rows').innerText()).split('\n').filter((l) => /^\d+ \d+\s*$/.test(l)).map((l) => l.trim());
    await page.keyboard.type('stty size\r');
    await page.waitForFunction(() => /\d+ \d+/.test(document.querySelector('#terminal .xterm-rows')?.innerText || ''));
    const before = await sizes();
    await page.setViewportSize({ width: 900, height: 600 });
    // The fit happens on the resize observer's next callback: ask until the shell sees a new size.
    const deadline = Date.now() + TIMEOUT;
    let seen = before;
    while (new Set(seen).size < 2) {
      check(Date.now() < deadline, `the shell's size stayed ${JSON.stringify(seen)} after the window shrank`);
      await page.keyboard.type('stty size\r');
      await page.waitForTimeout(300);
      seen = await sizes();
    }
    console.log(`stty size before/after the resize: ${JSON.stringify([...new Set(seen)])}`);
    await shot(page, '07-terminal');
    await page.setViewportSize({ width: 1280, height: 800 });
    say('terminal: exit closes cleanly with the exit code');
    await page.keyboard.type('exit 3\r');
    await page.locator('#terminal-status').filter({ hasText: 'exit code 3' }).waitFor();
    await shot(page, '08-terminal-closed');

    say('narrow window: readable without horizontal scrolling of the page');
    await page.setViewportSize({ width: 390, height: 800 });
    await page.getByRole('link', { name: 'Inventory' }).click();
    await agentRow.waitFor();
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    check(overflow <= 1, `the page is ${overflow}px wider than a 390px window`);
    await shot(page, '09-inventory-narrow');
    await page.setViewportSize({ width: 1280, height: 800 });

    say('sign out: the old session cookie is refused');
    const cookies = await context.cookies(BASE);
    const session = cookies.find((c) => c.name === 'svc_session');
    check(session, `a svc_session cookie: ${cookies.map((c) => c.name).join(', ')}`);
    check(session.httpOnly && session.secure && session.sameSite === 'Strict', `cookie flags ${JSON.stringify(session)}`);
    const cookie = `svc_session=${session.value}`;
    check((await statusWithCookie('/webapi/sessions/web', cookie)) === 200, 'the cookie works before signing out');
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.waitForURL(`${BASE}/web/login`);
    await page.getByText('You are signed out.').waitFor();
    const after = await statusWithCookie('/webapi/sessions/web', cookie);
    check(after === 401, `the old cookie after signing out answers ${after}, not 401`);

    say(`maintenance: ${EDITOR} changes the window`);
    await signIn(page, EDITOR, EDITOR_PASS);
    await page.getByRole('link', { name: 'Maintenance' }).click();
    await page.locator('#maintenance-current').filter({ hasText: '04:00 UTC' }).waitFor();
    await page.getByLabel('Start hour').selectOption('7');
    for (const day of ['Monday', 'Wednesday', 'Friday', 'Saturday', 'Sunday']) {
      await page.getByLabel(day, { exact: true }).uncheck();
    }
    for (const day of ['Tuesday', 'Thursday']) await page.getByLabel(day, { exact: true }).check();
    await page.getByRole('button', { name: 'Save' }).click();
    await page.getByRole('status').filter({ hasText: 'Saved.' }).waitFor();
    await page.locator('#maintenance-current').filter({ hasText: '07:00 UTC' }).waitFor();
    await shot(page, '10-maintenance-saved');

    say(`app: ${APP} opens in the browser with the user's identity`);
    await page.getByRole('link', { name: 'Resources' }).click();
    await page.getByRole('tab', { name: 'Applications' }).click();
    const appRow = page.locator(`tr[data-name="${APP}"]`);
    await appRow.waitFor();
    await shot(page, '11-resources-apps');
    const popup = context.waitForEvent('page', { timeout: TIMEOUT });
    await appRow.getByRole('button', { name: `Open ${APP}` }).click();
    const appPage = await popup;
    await appPage.waitForLoadState('load', { timeout: TIMEOUT });
    await appPage.getByText('svc-jwt-assertion', { exact: false }).first().waitFor();
    const appText = await appPage.locator('body').innerText();
    console.log(`app page: ${appPage.url()}`);
    console.log(`app says: ${appText.replace(/\s+/g, ' ')}`);
    // The app answers with the headers it received: the signed identity names the user.
    const received = JSON.parse(appText);
    const jwt = received.find(([name]) => name.toLowerCase() === 'svc-jwt-assertion')?.[1];
    check(jwt, 'the app received svc-jwt-assertion');
    const claims = JSON.parse(Buffer.from(jwt.split('.')[1], 'base64url').toString());
    console.log(`app identity claims: ${JSON.stringify(claims)}`);
    check(claims.username === EDITOR || claims.sub === EDITOR, `the JWT names ${EDITOR}`);
    await shot(appPage, '12-app');

    if (SSO_DISPLAY) {
      say(`single sign-on: "Sign in with ${SSO_DISPLAY}" signs ${SSO_USER} in through the provider`);
      await context.clearCookies();
      await page.goto(`${BASE}/`, { timeout: TIMEOUT });
      await page.waitForURL(`${BASE}/web/login`, { timeout: TIMEOUT });
      const button = page.getByRole('link', { name: `Sign in with ${SSO_DISPLAY}` });
      await button.waitFor();
      await shot(page, '13-sso-sign-in-page');
      await button.click();
      // Back from the provider, the proxy sends the browser to /web/, which shows Resources.
      await page.waitForURL((url) => url.href.startsWith(`${BASE}/web/`), { timeout: TIMEOUT });
      await page.locator('#who').filter({ hasText: SSO_USER }).waitFor({ timeout: TIMEOUT });
      await page.locator(`tr[data-name="${LOCAL_NODE}"]`).waitFor();
      await shot(page, '14-sso-signed-in');
    }

    say('no console errors');
    console.log(`expected API refusals seen by the browser: ${expectedApiErrors.join(', ')}`);
    check(consoleErrors.length === 0, `console errors:\n${consoleErrors.join('\n')}`);
    console.log('web UI scenario: ok');
  } catch (err) {
    if (current) {
      await current.screenshot({ path: path.join(ARTEFACTS, 'failure.png'), fullPage: true }).catch(() => {});
      console.error(`page at the failure (${current.url()}): ${path.join(ARTEFACTS, 'failure.png')}`);
    }
    throw err;
  } finally {
    await context.close();
    fs.rmSync(userData, { recursive: true, force: true });
  }
}

main().catch(async (err) => {
  console.error(`FAILED at step "${step}": ${err.stack || err}`);
  if (consoleErrors.length) console.error(`console errors:\n${consoleErrors.join('\n')}`);
  process.exit(1);
});
