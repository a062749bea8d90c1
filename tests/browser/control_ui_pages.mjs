#!/usr/bin/env node
// control_ui_pages.mjs — open every route of the OpenClaw Control UI's route table in the system
// Chromium and check that no answer on the way is `ok:false` and no page error is thrown;
// screenshot each page. The UI is loaded once and connects; each route is then opened the way a
// user's click opens it (the router's history navigation), on that one connection. (A full page
// load per route would race the UI against itself: on a fresh load a page may send its first
// request before the client's `connect`, which any v4 gateway refuses and closes.)
//
// Usage:
//   CLAWGATE_BROWSER_CACHE=/tmp/browser-cache CONTROL_UI_DIR=…/dist/control-ui \
//     node tests/browser/control_ui_pages.mjs 'http://127.0.0.1:PORT' TOKEN [OUTDIR]
//
// Inputs:
//   argv[2]                 the gateway's base URL
//   argv[3]                 its token
//   argv[4]                 output dir for the screenshots [./control-ui-pages]
//   CONTROL_UI_DIR          the Control UI files: the routes are read from its route table
//                           (assets/control-ui-core-*.js, the `id:{path:`…`}` entries)
//   CLAWGATE_BROWSER_CACHE  dir whose node_modules holds playwright-core
//   CHROMIUM                browser binary [/usr/bin/chromium]
//   QUIET_MS                a page is done when nothing was asked or answered for this long [1500]
//   PAGE_TIMEOUT_MS         the most a page may take to go quiet [30000]
//   EXPECT_USAGE_TOKENS     the total tokens `sessions.usage` must report on /usage
//
// Prints one line per route (requests, ok:false answers, page errors) and `RESULT: PASS` when
// every route is clean. Exit 0 = pass.

import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const BASE = process.argv[2];
const TOKEN = process.argv[3];
const OUTDIR = path.resolve(process.argv[4] || 'control-ui-pages');
const UI_DIR = process.env.CONTROL_UI_DIR;
const CACHE = process.env.CLAWGATE_BROWSER_CACHE || path.join(os.homedir(), '.cache', 'clawgate-browser');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const QUIET_MS = Number(process.env.QUIET_MS || 1500);
const PAGE_MS = Number(process.env.PAGE_TIMEOUT_MS || 30000);
const EXPECT_USAGE_TOKENS = process.env.EXPECT_USAGE_TOKENS;
if (!BASE || !TOKEN || !UI_DIR) {
  console.error('usage: CONTROL_UI_DIR=… node control_ui_pages.mjs BASE_URL TOKEN [OUTDIR]');
  process.exit(2);
}
fs.mkdirSync(OUTDIR, { recursive: true });
const { chromium } = createRequire(path.join(CACHE, 'package.json'))('playwright-core');

// The route table: `id:{path:`/x`…}` entries of the core bundle, each path once.
const assets = path.join(UI_DIR, 'assets');
const routes = new Set();
for (const file of fs.readdirSync(assets).filter((f) => /^control-ui-core-.*\.js$/.test(f))) {
  const text = fs.readFileSync(path.join(assets, file), 'utf8');
  for (const m of text.matchAll(/(?:[A-Za-z_$][\w$]*|"[^"]+"):\{path:`(\/[^`]*)`/g)) routes.add(m[1]);
}
if (routes.size < 20) {
  console.error(`RESULT: FAIL — only ${routes.size} routes found in ${assets}: is this the Control UI?`);
  process.exit(1);
}

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
const context = await browser.newContext({ serviceWorkers: 'block', viewport: { width: 1400, height: 900 } });
const page = await context.newPage();

// What the current route asked and was answered, from the page's WebSocket frames.
let current = null;
let lastFrame = Date.now();
const pending = new Map(); // `${socket}|${id}` -> method
let sockets = 0;
page.on('websocket', (ws) => {
  const socket = ++sockets;
  ws.on('framesent', ({ payload }) => {
    lastFrame = Date.now();
    let frame;
    try { frame = JSON.parse(String(payload)); } catch { return; }
    if (frame.type !== 'req' || !current) return;
    pending.set(`${socket}|${frame.id}`, frame.method);
    current.requests.push(frame.method);
  });
  ws.on('framereceived', ({ payload }) => {
    lastFrame = Date.now();
    let frame;
    try { frame = JSON.parse(String(payload)); } catch { return; }
    if (frame.type !== 'res' || !current) return;
    const method = pending.get(`${socket}|${frame.id}`) ?? '?';
    pending.delete(`${socket}|${frame.id}`);
    if (frame.ok === false) current.refused.push(`${method}: ${frame.error?.message ?? JSON.stringify(frame.error)}`);
    else current.answers.set(method, frame.payload);
  });
});
page.on('pageerror', (e) => current?.errors.push(String(e?.message || e)));

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// Until nothing was asked or answered for QUIET_MS and nothing is pending, within PAGE_MS.
async function settle(started) {
  while (Date.now() - started < PAGE_MS) {
    if (Date.now() - lastFrame >= QUIET_MS && pending.size === 0) return;
    await sleep(100);
  }
  current.errors.push(`unanswered after ${PAGE_MS} ms: ${[...new Set(pending.values())].join(', ')}`);
}

// Load the UI once, on the chat page, and wait until it is connected and quiet.
current = { route: '(load)', requests: [], refused: [], errors: [], answers: new Map() };
const loaded = Date.now();
lastFrame = loaded;
await page.goto(`${BASE}/chat#token=${encodeURIComponent(TOKEN)}`, { timeout: PAGE_MS })
  .catch((e) => current.errors.push(`navigation: ${e.message}`));
while (Date.now() - loaded < PAGE_MS && !current.answers.has('connect')) await sleep(100);
await settle(loaded);
if (!current.answers.has('connect') || current.refused.length || current.errors.length) {
  console.error(`RESULT: FAIL — the UI did not connect cleanly: ${[...current.refused, ...current.errors].join(' | ')}`);
  process.exit(1);
}
const sockets_at_load = sockets;

const results = [];
let n = 0;
for (const route of [...routes].sort()) {
  current = { route, requests: [], refused: [], errors: [], answers: new Map() };
  const started = Date.now();
  lastFrame = started;
  await page.evaluate((path) => {
    history.pushState(null, '', path);
    dispatchEvent(new PopStateEvent('popstate', { state: null }));
  }, route).catch((e) => current.errors.push(`navigation: ${e.message}`));
  await settle(started);
  if (route === '/usage' && EXPECT_USAGE_TOKENS !== undefined) {
    const report = current.answers.get('sessions.usage');
    const total = report?.totals?.totalTokens;
    if (String(total) !== String(EXPECT_USAGE_TOKENS)) {
      current.errors.push(`sessions.usage reported ${total} tokens, expected ${EXPECT_USAGE_TOKENS}`);
    }
  }
  const shot = path.join(OUTDIR, `${String(++n).padStart(2, '0')}${route.replaceAll('/', '_')}.png`);
  await page.screenshot({ path: shot }).catch((e) => current.errors.push(`screenshot: ${e.message}`));
  const clean = current.refused.length === 0 && current.errors.length === 0;
  console.log(`${clean ? 'clean' : 'FAIL '} ${route.padEnd(32)} ${String(current.requests.length).padStart(3)} requests` +
    `${current.refused.length ? `; ok:false: ${[...new Set(current.refused)].join(' | ')}` : ''}` +
    `${current.errors.length ? `; page errors: ${[...new Set(current.errors)].join(' | ')}` : ''}`);
  results.push({ route, clean });
}
current = null;
// One connection all the way: a page that made the UI reconnect would show here.
const reconnects = sockets - sockets_at_load;
await context.close().catch(() => {});
await browser.close().catch(() => {});

const failed = results.filter((r) => !r.clean);
console.log(`\nroutes: ${results.length}, clean: ${results.length - failed.length}`);
console.log(`connections opened after the load: ${reconnects}`);
if (failed.length || reconnects) {
  console.error(`RESULT: FAIL — ${[...failed.map((r) => r.route), ...(reconnects ? ['reconnected'] : [])].join(', ')}`);
  process.exit(1);
}
console.log('RESULT: PASS');
process.exit(0);
