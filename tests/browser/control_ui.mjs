#!/usr/bin/env node
// control_ui.mjs — drive the OpenClaw Control UI (the gateway's browser dashboard) in the
// system Chromium and assert the core chat flow over its WebSocket frames and its DOM.
//
// Usage:
//   CLAWGATE_BROWSER_CACHE=/tmp/browser-cache \
//     node tests/browser/control_ui.mjs 'http://127.0.0.1:PORT/#token=T' [OUTDIR]
// Install playwright-core once into the cache dir (never run `playwright install`):
//   mkdir -p "$CLAWGATE_BROWSER_CACHE" && cp tests/browser/package.json "$CLAWGATE_BROWSER_CACHE"/ &&
//   npm install --prefix "$CLAWGATE_BROWSER_CACHE" --no-audit --no-fund
//
// Inputs (argv wins over env):
//   argv[2] | CONTROL_UI_URL      page URL, e.g. http://127.0.0.1:18789/#token=testtoken
//   argv[3] | CONTROL_UI_OUT      output dir for screenshots and frames.jsonl [./control-ui-out]
//   CLAWGATE_BROWSER_CACHE        dir whose node_modules holds playwright-core [~/.cache/clawgate-browser]
//   CHROMIUM                      browser binary [/usr/bin/chromium]
//   STEP_TIMEOUT_MS               deadline of each ordinary wait [30000]
//   STREAM_TIMEOUT_MS             deadline for a slow (SLOW) reply to finish [90000]
//   ALLOW_FAILED_RES=1            list `res ok:false` answers grouped by method instead of failing
//   RUN_TAG                       suffix of every message sent [4 random hex digits; '' for none]
//   HEADFUL=1                     show the browser (debugging)
//
// Flow: connect → hello-ok; history (chat.startup/chat.history) ok; send "hello ECHO one <tag>"
// (Enter) and "hello SLOW two <tag>" (Send button, screenshot mid-stream and at the end); reload and
// see both turns again; send a SLOW message and click Stop (chat.abort aborted:true, chat
// state "aborted"); open a new session from the sidebar, then Home, then the new session from
// the sidebar list, then Home again. At the end no `res` may be ok:false. Always prints a
// summary (req count per method, ok:false per method with messages). Exit 0 = pass.

import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

// ---------------------------------------------------------------- config
const PAGE_URL = process.argv[2] || process.env.CONTROL_UI_URL;
const OUTDIR = path.resolve(process.argv[3] || process.env.CONTROL_UI_OUT || 'control-ui-out');
const CACHE = process.env.CLAWGATE_BROWSER_CACHE || path.join(os.homedir(), '.cache', 'clawgate-browser');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const STEP_MS = Number(process.env.STEP_TIMEOUT_MS || 30000);
const STREAM_MS = Number(process.env.STREAM_TIMEOUT_MS || 90000);
const ALLOW_FAILED_RES = process.env.ALLOW_FAILED_RES === '1';
// A tag appended to every message so that a reused gateway's older turns never satisfy a check.
const TAG = process.env.RUN_TAG ?? Math.random().toString(16).slice(2, 6);
const M = (s) => (TAG ? `${s} ${TAG}` : s);
const MSG = { one: M('hello ECHO one'), two: M('hello SLOW two'), three: M('please SLOW three then stop'), side: M('hello ECHO side') };

if (!PAGE_URL) {
  console.error('usage: node control_ui.mjs <page-url, e.g. http://127.0.0.1:18789/#token=T> [outdir]');
  process.exit(2);
}

let chromium;
try {
  const require = createRequire(path.join(path.resolve(CACHE), 'node_modules', '/'));
  ({ chromium } = require('playwright-core'));
} catch (e) {
  console.error(`FAIL setup: playwright-core not found under ${CACHE}/node_modules (${e.message}).\n` +
    `Install it: mkdir -p "${CACHE}" && cp ${path.join(path.dirname(new URL(import.meta.url).pathname), 'package.json')} "${CACHE}/" && ` +
    `npm install --prefix "${CACHE}" --no-audit --no-fund`);
  process.exit(2);
}
fs.mkdirSync(OUTDIR, { recursive: true });

// ---------------------------------------------------------------- frame log
const T0 = Date.now();
const records = [];          // capture-format records, written to frames.jsonl at the end
const listeners = new Set(); // (rec) => void, woken on every new record
const reqs = new Map();      // `${conn}|${id}` -> {method, params, rec}
const resList = [];          // {conn, id, method, ok, payload, error, rec}
const events = [];           // {conn, event, payload, rec}
let connSeq = 0;

function push(rec) {
  rec = { t: Date.now(), dt: Date.now() - T0, ...rec };
  records.push(rec);
  if (rec.kind === 'frame' && rec.json) {
    const j = rec.json;
    if (rec.dir === 'c2s' && j.type === 'req') {
      reqs.set(`${rec.conn}|${j.id}`, { method: j.method, params: j.params, rec });
    } else if (rec.dir === 's2c' && j.type === 'res') {
      const r = reqs.get(`${rec.conn}|${j.id}`);
      resList.push({ conn: rec.conn, id: j.id, method: r ? r.method : '?', params: r && r.params, ok: j.ok, payload: j.payload, error: j.error, rec });
    } else if (rec.dir === 's2c' && j.type === 'event') {
      events.push({ conn: rec.conn, event: j.event, payload: j.payload, rec });
    }
  }
  for (const l of [...listeners]) l(rec);
  return rec;
}

const idx = () => records.length;

// Wait until pred(record) is true for a record at index >= since (past or future).
function waitRecord(pred, { since = 0, timeout = STEP_MS, what }) {
  for (let i = since; i < records.length; i++) if (pred(records[i])) return Promise.resolve(records[i]);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => { listeners.delete(l); reject(new Error(`timeout after ${timeout} ms waiting for ${what}`)); }, timeout);
    const l = (rec) => { if (pred(rec)) { clearTimeout(timer); listeners.delete(l); resolve(rec); } };
    listeners.add(l);
  });
}
const isReq = (method, f = () => true) => (r) => r.kind === 'frame' && r.dir === 'c2s' && r.json?.type === 'req' && r.json.method === method && f(r.json.params || {}, r);
const isResTo = (reqRec) => (r) => r.kind === 'frame' && r.dir === 's2c' && r.conn === reqRec.conn && r.json?.type === 'res' && r.json.id === reqRec.json.id;
const isEvent = (name, f = () => true) => (r) => r.kind === 'frame' && r.dir === 's2c' && r.json?.type === 'event' && r.json.event === name && f(r.json.payload || {}, r);

async function waitReqRes(method, { since = 0, timeout = STEP_MS, filter, what } = {}) {
  const req = await waitRecord(isReq(method, filter), { since, timeout, what: what || `req ${method}` });
  const res = await waitRecord(isResTo(req), { since, timeout, what: `res to ${method} (${req.json.id})` });
  if (res.json.ok !== true) throw new Error(`${method} answered ok:false: ${JSON.stringify(res.json.error)}`);
  return { req, res, params: req.json.params || {}, payload: res.json.payload };
}

// Poll a (sync or async) condition; a deadline on every wait.
async function waitUntil(fn, { timeout = STEP_MS, interval = 100, what }) {
  const end = Date.now() + timeout;
  let last;
  for (;;) {
    try { last = await fn(); if (last) return last; } catch (e) { last = e; }
    if (Date.now() > end) throw new Error(`timeout after ${timeout} ms waiting for ${what}${last instanceof Error ? ` (last error: ${last.message})` : ''}`);
    await new Promise((r) => setTimeout(r, interval));
  }
}

const textOf = (msg) => {
  if (!msg) return '';
  if (typeof msg.content === 'string') return msg.content;
  if (Array.isArray(msg.content)) return msg.content.map((c) => (c && typeof c.text === 'string' ? c.text : '')).join('');
  return typeof msg.text === 'string' ? msg.text : '';
};
const norm = (s) => String(s || '').replace(/\s+/g, ' ').trim();

// ---------------------------------------------------------------- browser
const browser = await chromium.launch({
  executablePath: CHROMIUM,
  headless: process.env.HEADFUL !== '1',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
const context = await browser.newContext({ serviceWorkers: 'block', viewport: { width: 1400, height: 900 } });
const page = await context.newPage();
page.setDefaultTimeout(STEP_MS);

// In-page hooks: the "rendered" signal of the UI, and close codes of the page's sockets
// (Playwright's websocket "close" carries no code). Sockets are numbered in creation order,
// which is the order of Playwright's "websocket" events.
const closeInfo = new Map(); // creation number -> {code, reason, side}
let pageWsCreated = 0;
await page.exposeBinding('__cgWsCreated', () => ++pageWsCreated);
await page.exposeBinding('__cgWsClosed', (_src, n, info) => { closeInfo.set(n, info); recordClose(n); });
await page.addInitScript(() => {
  window.__cgRendered = false;
  addEventListener('openclaw-control-ui-rendered', () => { window.__cgRendered = true; });
  const Native = window.WebSocket;
  class Recorded extends Native {
    constructor(...a) {
      super(...a);
      const n = window.__cgWsCreated();
      let byClient = null;
      const origClose = this.close.bind(this);
      this.close = (code, reason) => { byClient = { code: code ?? 1005, reason: reason ?? '' }; return origClose(code, reason); };
      this.addEventListener('close', (ev) => {
        n.then((k) => window.__cgWsClosed(k, byClient
          ? { side: 'client', code: byClient.code, reason: byClient.reason }
          : { side: 'server', code: ev.code, reason: ev.reason, wasClean: ev.wasClean }));
      });
    }
  }
  window.WebSocket = Recorded;
});

// Connections: Playwright's "websocket" events give the frames; a CDP session on the page gives
// the handshake headers. Closes come from the in-page hook (code and side) or, for sockets torn
// down by a reload/navigation the driver starts (neither Playwright nor CDP reports those), from
// closeAllOpen(). All three number sockets in creation order, so the k-th of each is the same socket.
const upgradeRec = new Map(); // conn -> its upgrade record (headers filled in from CDP)
const cdpHeaders = new Map(); // conn -> handshake request headers
const cdpConn = new Map();    // CDP requestId -> conn
const closed = new Set();
let cdpSeq = 0;
const cdp = await context.newCDPSession(page);
await cdp.send('Network.enable');
cdp.on('Network.webSocketCreated', (e) => { cdpConn.set(e.requestId, ++cdpSeq); });
cdp.on('Network.webSocketWillSendHandshakeRequest', (e) => {
  const conn = cdpConn.get(e.requestId);
  if (!conn) return;
  const h = Object.fromEntries(Object.entries(e.request?.headers || {}).map(([k, v]) => [k.toLowerCase(), v]));
  cdpHeaders.set(conn, h);
  const u = upgradeRec.get(conn);
  if (u) u.headers = { ...u.headers, ...h };
});
function recordClose(conn, fallback) {
  if (closed.has(conn)) return;
  const info = closeInfo.get(conn);
  if (!info && !fallback) {
    // Playwright/CDP saw a close: give the in-page handler a moment to report code and side
    setTimeout(() => recordClose(conn, { side: 'unknown', code: null, reason: '' }), 300);
    return;
  }
  closed.add(conn);
  push({ kind: 'close', conn, ...(info || fallback) });
}
// the driver is about to reload or leave the page: the browser drops its sockets (going away)
function closeAllOpen(reason) {
  for (let c = 1; c <= connSeq; c++) recordClose(c, { side: 'client', code: null, reason });
}
cdp.on('Network.webSocketClosed', (e) => { const conn = cdpConn.get(e.requestId); if (conn) recordClose(conn); });
cdp.on('Network.webSocketFrameError', (e) => { const conn = cdpConn.get(e.requestId); if (conn) push({ kind: 'error', conn, message: e.errorMessage }); });

page.on('websocket', (ws) => {
  const conn = ++connSeq;
  const u = new URL(ws.url());
  upgradeRec.set(conn, push({ kind: 'upgrade', conn, url: u.pathname + u.search, headers: cdpHeaders.get(conn) || { host: u.host } }));
  push({ kind: 'open', conn });
  const frame = (dir) => (f) => {
    const s = typeof f.payload === 'string' ? f.payload : Buffer.from(f.payload).toString('utf8');
    let json; try { json = JSON.parse(s); } catch { json = undefined; }
    push(json === undefined ? { kind: 'frame', conn, dir, bytes: Buffer.byteLength(s), text: s } : { kind: 'frame', conn, dir, bytes: Buffer.byteLength(s), json });
  };
  ws.on('framesent', frame('c2s'));
  ws.on('framereceived', frame('s2c'));
  ws.on('socketerror', (err) => push({ kind: 'error', conn, message: String(err) }));
  ws.on('close', () => recordClose(conn));
});
const pageErrors = [];
page.on('pageerror', (e) => pageErrors.push(String(e && e.message || e)));

// ---------------------------------------------------------------- locators (see README in the report)
// Only the visible chat pane is exposed to the accessibility tree (cached panes are inert and
// aria-hidden), so role locators pick the live pane.
const composer = () => page.getByRole('textbox', { name: 'Chat composer' });
const sendButton = () => page.getByRole('button', { name: 'Send message' });
const stopButton = () => page.getByRole('button', { name: /^Stop generating$/ });
const thread = () => page.getByRole('log').first();
const assistantGroups = () => thread().locator('.chat-group.assistant');
const userGroups = () => thread().locator('.chat-group.user');
async function groupTexts(loc) { return (await loc.allInnerTexts()).map(norm); }
async function threadHas(text, role) {
  const loc = role === 'assistant' ? assistantGroups() : role === 'user' ? userGroups() : thread();
  const t = norm(text);
  return (await groupTexts(loc)).some((g) => g.includes(t));
}

let shot = 0;
async function screenshot(name) {
  const file = path.join(OUTDIR, `${String(++shot).padStart(2, '0')}-${name}.png`);
  await page.screenshot({ path: file });
  console.log(`  screenshot ${file}`);
  return file;
}

// ---------------------------------------------------------------- steps
const results = [];
async function step(name, fn) {
  const t = Date.now();
  process.stdout.write(`• ${name}\n`);
  try { await fn(); } catch (e) { e.message = `[${name}] ${e.message}`; throw e; }
  results.push({ name, ms: Date.now() - t });
  console.log(`  ok (${Date.now() - t} ms)`);
}

async function waitConnected(since, what) {
  const req = await waitRecord(isReq('connect'), { since, what: `connect req (${what})` });
  const res = await waitRecord(isResTo(req), { since, what: `connect res (${what})` });
  if (!res.json.ok) throw new Error(`connect rejected: ${JSON.stringify(res.json.error)}`);
  if (res.json.payload?.type !== 'hello-ok') throw new Error(`connect answered without hello-ok: ${JSON.stringify(res.json.payload).slice(0, 200)}`);
  return { req, res };
}

async function waitHistoryOk(since, sessionKey) {
  const pred = (r) => r.kind === 'frame' && r.dir === 'c2s' && r.json?.type === 'req' &&
    (r.json.method === 'chat.startup' || r.json.method === 'chat.history') &&
    (!sessionKey || r.json.params?.sessionKey === sessionKey);
  // the first history read after `since` that is answered (ok or not)
  const req = await waitRecord(pred, { since, what: `chat.startup/chat.history req${sessionKey ? ` for ${sessionKey}` : ''}` });
  const res = await waitRecord(isResTo(req), { since, what: `res to ${req.json.method}` });
  if (!res.json.ok) throw new Error(`${req.json.method} answered ok:false: ${JSON.stringify(res.json.error)}`);
  return { req, res, method: req.json.method, payload: res.json.payload };
}

async function typeMessage(text) {
  const box = composer();
  await box.waitFor({ state: 'visible', timeout: STEP_MS });
  await waitUntil(async () => box.isEditable(), { what: 'composer editable' });
  await box.click();
  await box.fill(text);
  await waitUntil(async () => (await box.inputValue()) === text, { what: `composer to hold "${text}"` });
}

async function assertSendEnabled() {
  const btn = sendButton();
  try {
    await btn.waitFor({ state: 'visible', timeout: STEP_MS });
    await waitUntil(async () => btn.isEnabled(), { what: 'Send button enabled' });
  } catch (e) {
    const hint = norm(await page.locator('.chat-footer, .agent-chat__composer-shell').first().innerText().catch(() => ''));
    throw new Error(`sending is not enabled (${e.message}); composer area says: "${hint.slice(0, 300)}"`);
  }
}

// Send `text` via Enter or the Send button; returns {runId, ack, sendReq}.
async function send(text, how) {
  const since = idx();
  await typeMessage(text);
  await assertSendEnabled();
  if (how === 'click') await sendButton().click(); else await composer().press('Enter');
  const { req, payload } = await waitReqRes('chat.send', { since, filter: (p) => p.message === text, what: `chat.send with message "${text}"` });
  const runId = payload?.runId || req.json.params.idempotencyKey;
  if (!runId) throw new Error(`chat.send ack has no runId: ${JSON.stringify(payload)}`);
  if (!['started', 'ok', 'in_flight'].includes(payload?.status)) throw new Error(`chat.send ack status ${JSON.stringify(payload?.status)}`);
  console.log(`  chat.send ack status=${payload.status} runId=${runId}`);
  return { runId, ack: payload, sendReq: req, since };
}

const chatEv = (runId, state) => isEvent('chat', (p) => p.runId === runId && (!state || p.state === state));

async function waitFinalAndDom(runId, since, timeout) {
  const fin = await waitRecord((r) => chatEv(runId)(r) && ['final', 'aborted', 'error'].includes(r.json.payload.state), { since, timeout, what: `chat final for run ${runId}` });
  const p = fin.json.payload;
  if (p.state !== 'final') throw new Error(`run ${runId} ended with state ${p.state}: ${JSON.stringify(p).slice(0, 300)}`);
  const deltas = records.slice(since).filter(chatEv(runId, 'delta')).length;
  if (!deltas) throw new Error(`no chat delta event for run ${runId} before its final`);
  const text = textOf(p.message);
  console.log(`  chat deltas=${deltas} final text="${norm(text).slice(0, 80)}"`);
  if (norm(text)) await waitUntil(() => threadHas(text, 'assistant'), { what: `assistant reply "${norm(text).slice(0, 60)}" in the transcript` });
  return { text, deltas };
}

// ---------------------------------------------------------------- the flow
let failed = null;
const state = {};
try {
  await step('1. open the page; connect → hello-ok', async () => {
    const since = idx();
    await page.goto(PAGE_URL, { waitUntil: 'domcontentloaded', timeout: STEP_MS });
    const { res } = await waitConnected(since, 'first load');
    state.hello = res.json.payload;
    console.log(`  hello-ok protocol=${state.hello.protocol} server=${state.hello.server?.version} methods=${state.hello.features?.methods?.length}`);
    await waitUntil(() => page.evaluate(() => window.__cgRendered === true), { what: 'window event openclaw-control-ui-rendered' });
    await composer().waitFor({ state: 'visible', timeout: STEP_MS });
  });

  await step('2. the chat loads its history (chat.startup / chat.history ok)', async () => {
    const h = await waitHistoryOk(0);
    state.sessionKey = h.payload?.sessionKey || h.req.json.params.sessionKey;
    console.log(`  ${h.method} ok for ${state.sessionKey}: ${h.payload?.messages?.length ?? '?'} messages`);
  });

  await step('3a. send "hello ECHO one" with Enter; reply streams and appears', async () => {
    const s = await send(MSG.one, 'enter');
    await waitUntil(() => threadHas(MSG.one, 'user'), { what: 'user message in the transcript' });
    state.one = await waitFinalAndDom(s.runId, s.since, STREAM_MS);
  });

  await step('3b. send "hello SLOW two" with the Send button; screenshot mid-stream and at the end', async () => {
    const s = await send(MSG.two, 'click');
    const d = await waitRecord(chatEv(s.runId, 'delta'), { since: s.since, timeout: STREAM_MS, what: `first chat delta of run ${s.runId}` });
    const first = norm(d.json.payload.deltaText || textOf(d.json.payload.message)).split(' ')[0];
    await waitUntil(async () => (await stopButton().isVisible()) && (first ? threadHas(first, 'assistant') : true), { what: 'streaming reply visible with a Stop button' });
    const finalBefore = records.slice(s.since).some(chatEv(s.runId, 'final'));
    await screenshot('mid-stream');
    const finalAfter = records.slice(s.since).some(chatEv(s.runId, 'final'));
    if (finalBefore || finalAfter) throw new Error('the reply was already final when the mid-stream screenshot was taken');
    state.two = await waitFinalAndDom(s.runId, s.since, STREAM_MS);
    await waitUntil(async () => !(await stopButton().isVisible()), { what: 'Stop button gone after final' });
    await screenshot('end-of-stream');
  });

  await step('4. reload; after reconnect both turns are visible again', async () => {
    const since = idx();
    const before = connSeq;
    closeAllOpen('page reload');
    await page.reload({ waitUntil: 'domcontentloaded', timeout: STEP_MS });
    const { req } = await waitConnected(since, 'after reload');
    if (req.conn <= before) throw new Error('no new WebSocket connection after reload');
    const h = await waitHistoryOk(since, state.sessionKey);
    console.log(`  ${h.method} ok after reload: ${h.payload?.messages?.length ?? '?'} messages`);
    for (const [t, role] of [[MSG.one, 'user'], [state.one.text, 'assistant'], [MSG.two, 'user'], [state.two.text, 'assistant']]) {
      await waitUntil(() => threadHas(t, role), { what: `${role} "${norm(t).slice(0, 40)}" visible after reload` });
    }
    await screenshot('after-reload');
  });

  await step('5. send a SLOW message and click Stop; chat.abort aborted:true, chat state aborted', async () => {
    // On a loaded machine the click can come after the run ended by itself
    // (its final already on the wire): then there was nothing to stop, and
    // the step is tried again with a new run, at most three times. A run
    // still going when the abort came must be aborted.
    let s, btn;
    for (let attempt = 1; ; attempt++) {
      s = await send(MSG.three, 'enter');
      await waitRecord(chatEv(s.runId, 'delta'), { since: s.since, timeout: STREAM_MS, what: `first chat delta of run ${s.runId}` });
      btn = stopButton();
      await btn.waitFor({ state: 'visible', timeout: STEP_MS });
      // Clicked at once: a screenshot first can take seconds on a loaded
      // machine, long enough for the run to end by itself.
      const since = idx();
      let clickFailed = null;
      // The button leaves the page when the run ends: a click that cannot
      // land in a few seconds met a run that had ended.
      await btn.click({ timeout: 5000 }).catch((err) => { clickFailed = err; });
      let answer = null;
      if (!clickFailed) {
        answer = await waitReqRes('chat.abort', { since });
        console.log(`  chat.abort params=${JSON.stringify(answer.params)} → ${JSON.stringify(answer.payload)}`);
        if (answer.payload?.aborted === true) break;
      }
      // Its final reached the page by the time the abort was answered (or
      // the click gave up).
      const endedFirst = records.slice(s.since, idx()).some(chatEv(s.runId, 'final'));
      if (!endedFirst || attempt === 3) {
        if (clickFailed) throw clickFailed;
        throw new Error(`chat.abort did not answer aborted:true: ${JSON.stringify(answer.payload)}`);
      }
      console.log(`  run ${s.runId} ended before the click (attempt ${attempt}); again`);
      await waitUntil(async () => !(await stopButton().isVisible()), { what: 'Stop button gone after final' });
    }
    const ab = await waitRecord(chatEv(s.runId, 'aborted'), { since: s.since, what: `chat event state "aborted" for run ${s.runId}` });
    console.log(`  chat aborted stopReason=${ab.json.payload.stopReason}`);
    await waitUntil(async () => !(await btn.isVisible()), { what: 'Stop button gone after abort' });
    await screenshot('after-stop');
  });

  await step('6. switch to a new session (sidebar "New conversation") and back', async () => {
    let since = idx();
    await page.getByRole('link', { name: 'New conversation' }).first().click();
    const box = page.getByRole('textbox', { name: /work on\?/i });
    await box.waitFor({ state: 'visible', timeout: STEP_MS });
    await box.fill(MSG.side);
    await screenshot('new-session-page');
    await box.press('Enter');
    const created = await waitReqRes('sessions.create', { since });
    const sideKey = created.payload?.key || created.params.key;
    console.log(`  sessions.create key=${sideKey} params=${Object.keys(created.params).join(',')}`);
    // the session's route is /chat/<agent>/<slug-><id without dashes>; the slug follows the title
    const sideId = String(sideKey).split(':').pop().replace(/-/g, '');
    const onSide = () => new URL(page.url()).pathname.includes(sideId);
    await waitUntil(onSide, { what: `URL of the new session (/chat/<agent>/…${sideId})` });
    await waitUntil(() => threadHas(MSG.side, 'user'), { what: 'the new session shows its first message' });
    const fin = await waitRecord(isEvent('chat', (p) => p.sessionKey === sideKey && p.state === 'final'), { since, timeout: STREAM_MS, what: `chat final in ${sideKey}` });
    const sideText = textOf(fin.json.payload.message);
    if (norm(sideText)) await waitUntil(() => threadHas(sideText, 'assistant'), { what: 'the new session shows its reply' });
    await screenshot('new-session');

    // back to the main session (Home)
    await page.getByRole('link', { name: 'Home', exact: true }).click();
    await waitUntil(() => new URL(page.url()).pathname === '/chat/main' || /\/chat\/main\/?$/.test(new URL(page.url()).pathname), { what: 'URL /chat/main' });
    await waitUntil(async () => (await threadHas(MSG.one, 'user')) && !(await threadHas(MSG.side, 'user')), { what: 'main session transcript (and not the new one)' });
    await screenshot('back-to-main');

    // and to the new session again via its row in the sidebar session list
    since = idx();
    const row = page.getByRole('link').and(page.locator(`[href*="${sideId}"]`)).first();
    await row.waitFor({ state: 'visible', timeout: STEP_MS });
    await row.click();
    await waitUntil(onSide, { what: `URL of the new session (…${sideId})` });
    await waitUntil(async () => (await threadHas(MSG.side, 'user')) && !(await threadHas(MSG.one, 'user')), { what: 'the new session transcript (and not main)' });
    await screenshot('side-again');
    await page.getByRole('link', { name: 'Home', exact: true }).click();
    await waitUntil(() => threadHas(MSG.two, 'user'), { what: 'main session transcript again' });
    await screenshot('final');
  });
} catch (e) {
  failed = e;
  console.error(`FAIL ${e.message}`);
  try { await screenshot('failure'); } catch {}
}

// let late answers land, leave the page so its sockets close (and get close records), then quit
await new Promise((r) => setTimeout(r, 500));
closeAllOpen('page closed');
await page.goto('about:blank', { timeout: STEP_MS }).catch(() => {});
await context.close().catch(() => {});
await browser.close().catch(() => {});
await new Promise((r) => setTimeout(r, 300));

// ---------------------------------------------------------------- output + summary
records.sort((a, b) => a.t - b.t);
fs.writeFileSync(path.join(OUTDIR, 'frames.jsonl'), records.map((r) => JSON.stringify(r)).join('\n') + '\n');

const reqCount = {};
for (const r of records) if (r.kind === 'frame' && r.dir === 'c2s' && r.json?.type === 'req') reqCount[r.json.method] = (reqCount[r.json.method] || 0) + 1;
const bad = {};
for (const r of resList) if (r.ok === false) (bad[r.method] ||= []).push(r.error?.message || JSON.stringify(r.error));
const evCount = {};
for (const e of events) evCount[e.event] = (evCount[e.event] || 0) + 1;

console.log(`\nframes: ${records.length} records, ${connSeq} connection(s) → ${path.join(OUTDIR, 'frames.jsonl')}`);
console.log('req per method:');
for (const [m, n] of Object.entries(reqCount).sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]))) console.log(`  ${String(n).padStart(4)}  ${m}`);
console.log('events:');
for (const [m, n] of Object.entries(evCount).sort((a, b) => b[1] - a[1])) console.log(`  ${String(n).padStart(4)}  ${m}`);
const badTotal = Object.values(bad).reduce((a, l) => a + l.length, 0);
console.log(`ok:false answers: ${badTotal}`);
for (const [m, msgs] of Object.entries(bad).sort()) {
  const uniq = [...new Set(msgs)];
  console.log(`  ${String(msgs.length).padStart(4)}  ${m}: ${uniq.slice(0, 3).join(' | ')}${uniq.length > 3 ? ` (+${uniq.length - 3} more)` : ''}`);
}
if (pageErrors.length) console.log(`page errors (${pageErrors.length}): ${[...new Set(pageErrors)].slice(0, 5).join(' | ')}`);

if (failed) { console.error(`\nRESULT: FAIL — ${failed.message}`); process.exit(1); }
if (badTotal && !ALLOW_FAILED_RES) { console.error(`\nRESULT: FAIL — ${badTotal} res frame(s) with ok:false (set ALLOW_FAILED_RES=1 to only list them)`); process.exit(1); }
console.log(`\nRESULT: PASS (${results.length} steps${badTotal ? `, ${badTotal} ok:false allowed by ALLOW_FAILED_RES=1` : ''})`);
process.exit(0);
