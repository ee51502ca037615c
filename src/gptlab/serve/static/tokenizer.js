// The token viewer page: sends the text to /tokenizer/api/encode (one request per change, debounced) and draws each
// tokenizer's tokens. Every piece of text goes into the DOM through textContent, never as HTML. Long results are cut
// into chunks of tokens; only chunks near the visible part of a panel hold spans (IntersectionObserver).
'use strict';

const DEBOUNCE_MS = 150;
const CHUNK_TOKENS = 300; // a chunk ends at the first newline token after this many tokens...
const MAX_CHUNK_TOKENS = 1500; // ...or here, in text with no newlines
const LINK_TEXT_LIMIT = 20000; // longer text is left out of the link (URLs of megabytes break browsers)
const strict = new TextDecoder('utf-8', {fatal: true});

const state = {all: [], chosen: [], mode: 'text', showIds: false, results: [], timer: 0, controller: null, sequence: 0};
const $ = (selector) => document.querySelector(selector);

// `gptlab serve --api-key`: the key the web chat keeps in this browser (same origin), sent as the API wants it.
function requestHeaders() {
  const headers = {'Content-Type': 'application/json'};
  let key = null;
  try { key = window.localStorage.getItem('gptlab.apiKey'); } catch (error) { key = null; }
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

function hexToBytes(hex) {
  const bytes = new Uint8Array(hex.length / 2);
  for (let i = 0; i < bytes.length; i++) bytes[i] = parseInt(hex.substr(2 * i, 2), 16);
  return bytes;
}

// How each distinct id looks: its text, or its bytes in hex when they are not whole UTF-8 characters, or a badge.
function describe(result) {
  const special = new Set(result.special);
  const look = new Map();
  for (const [key, hex] of Object.entries(result.table)) {
    const id = Number(key), bytes = hexToBytes(hex);
    const hexText = Array.from(bytes, (b) => b.toString(16).toUpperCase().padStart(2, '0')).join(' ');
    let kind = 'text', text;
    try { text = strict.decode(bytes); } catch { kind = 'bytes'; text = hexText; }
    if (special.has(id)) kind = 'special';
    const piece = result.pieces ? result.pieces[key] : undefined;
    const title = `id ${id}` + (piece !== undefined ? ` · piece ${JSON.stringify(piece)}` : '') +
      ` · bytes ${hexText || '(none)'}` + (kind === 'special' ? ' · special token' : '');
    look.set(id, {kind, text, title, newline: kind === 'text' && text.endsWith('\n')});
  }
  return look;
}

// Token positions where chunks start: after CHUNK_TOKENS at a newline token, else every MAX_CHUNK_TOKENS.
function chunkStarts(ids, look) {
  const starts = [0];
  for (let i = 0, size = 0; i < ids.length - 1; i++) {
    size++;
    if ((size >= CHUNK_TOKENS && look.get(ids[i]).newline) || size >= MAX_CHUNK_TOKENS) { starts.push(i + 1); size = 0; }
  }
  return starts;
}

// A token's text with spaces, tabs and newlines made visible; only text nodes and spans, built with textContent.
function appendVisible(span, text) {
  let plain = '';
  const flush = () => { if (plain) { span.append(plain); plain = ''; } };
  for (const character of text) {
    const mark = character === ' ' ? '·' : character === '\t' ? '→' : character === '\n' ? '↵' : character === '\r' ? '␍' : null;
    if (mark === null) { plain += character; continue; }
    flush();
    const ws = document.createElement('span');
    ws.className = 'ws';
    ws.textContent = mark;
    span.append(ws);
    if (character === '\n') span.append(document.createElement('br'));
  }
  flush();
}

function tokenSpan(id, position, look) {
  const info = look.get(id);
  const span = document.createElement('span');
  span.className = `tok t${position % 5}` + (info.kind === 'text' ? '' : ' ' + info.kind);
  span.title = info.title;
  span.dataset.id = id;
  if (state.showIds) span.textContent = String(id);
  else if (info.kind === 'text') appendVisible(span, info.text);
  else span.textContent = info.text;
  return span;
}

function fillChunk(chunk, view) {
  if (chunk.childElementCount) return;
  const start = Number(chunk.dataset.start), end = Number(chunk.dataset.end);
  const fragment = document.createDocumentFragment();
  for (let i = start; i < end; i++) fragment.append(tokenSpan(view.ids[i], i, view.look));
  chunk.append(fragment);
  chunk.style.minHeight = '';
}

function emptyChunk(chunk) {
  if (!chunk.childElementCount) return;
  chunk.style.minHeight = chunk.offsetHeight + 'px'; // keep its place so the scroll position does not jump
  chunk.replaceChildren();
}

// Placeholders for all chunks, sized by a guess until drawn; the observer fills those near the view.
function drawTokens(container, result) {
  const view = {ids: result.ids, look: describe(result)};
  const starts = chunkStarts(view.ids, view.look);
  const perLine = Math.max(20, Math.floor((container.clientWidth || 600) / 8.5));
  const lineHeight = 24;
  if (container.observer) container.observer.disconnect();
  const observer = new IntersectionObserver((entries) => {
    for (const entry of entries) (entry.isIntersecting ? fillChunk : emptyChunk)(entry.target, view);
  }, {root: container, rootMargin: '600px 0px'});
  container.observer = observer;
  const chunks = starts.map((start, n) => {
    const end = n + 1 < starts.length ? starts[n + 1] : view.ids.length;
    let lines = 1, characters = 0;
    for (let i = start; i < end; i++) {
      const info = view.look.get(view.ids[i]);
      characters += state.showIds ? 6 : info.text.length;
      if (info.newline && !state.showIds) lines++;
    }
    const chunk = document.createElement('div');
    chunk.className = 'chunk';
    chunk.dataset.start = start;
    chunk.dataset.end = end;
    chunk.style.minHeight = (lines + Math.floor(characters / perLine)) * lineHeight + 'px';
    return chunk;
  });
  container.replaceChildren(...chunks);
  container.scrollTop = 0;
  chunks.forEach((chunk) => observer.observe(chunk));
  if (chunks.length) fillChunk(chunks[0], view); // the first lines show at once, before the observer's first call
}

// Characters as Python and the server count them (code points), not UTF-16 units as String.length does.
const codePoints = (text) => text.length - (text.match(/[\uD800-\uDBFF][\uDC00-\uDFFF]/g) || []).length;

// A path's last part ("/home/me/tok/" -> "tok"); names like gpt2 stay as they are. The full spec is the title.
const shortName = (name) => name.split(/[\\/]/).filter(Boolean).pop() || name;

const ratio = (a, b) => (b ? (a / b).toFixed(2) : '–');

function drawPanel(result) {
  const panel = $('#panel-template').content.firstElementChild.cloneNode(true);
  panel.dataset.name = result.name;
  panel.querySelector('.name').textContent = shortName(result.name);
  panel.querySelector('.name').title = result.name;
  panel.querySelector('.count-tokens').textContent = result.tokens.toLocaleString('en-US');
  panel.querySelector('.count-bytes').textContent = result.bytes.toLocaleString('en-US');
  panel.querySelector('.count-characters').textContent = result.characters.toLocaleString('en-US');
  panel.querySelector('.bytes-per-token').textContent = ratio(result.bytes, result.tokens);
  panel.querySelector('.chars-per-token').textContent = ratio(result.characters, result.tokens);
  const note = panel.querySelector('.note');
  if (result.error || result.note) {
    note.hidden = false;
    note.textContent = result.error || result.note;
    note.classList.toggle('error', Boolean(result.error));
  }
  return panel;
}

function drawAll() {
  const panels = $('#panels');
  panels.classList.toggle('show-ids', state.showIds);
  const drawn = state.results.map(drawPanel);
  panels.replaceChildren(...drawn);
  state.results.forEach((result, n) => drawTokens(drawn[n].querySelector('.tokens'), result));
}

function setStatus(text, error = false) {
  $('#status').textContent = text;
  $('#status').classList.toggle('error', error);
  if (error) $('#status').setAttribute('role', 'alert'); else $('#status').setAttribute('role', 'status');
}

async function encodeNow() {
  const text = $('#input').value, sequence = ++state.sequence;
  if (state.controller) state.controller.abort();
  const controller = state.controller = new AbortController();
  const panels = $('#panels');
  panels.setAttribute('aria-busy', 'true');
  saveFragment(text);
  try {
    if (!state.chosen.length) { state.results = []; drawAll(); setStatus('Choose a tokenizer above.'); return; }
    if (state.mode === 'chat' && !text.trim()) { state.results = []; drawAll(); setStatus('Write a conversation: user: …'); return; }
    const response = await fetch('api/encode', {
      method: 'POST', headers: requestHeaders(), signal: controller.signal,
      body: JSON.stringify({text, tokenizers: state.chosen, mode: state.mode}),
    });
    const body = await response.json().catch(() => ({error: {message: `the server answered ${response.status}`}}));
    if (sequence !== state.sequence) return;
    if (!response.ok) { setStatus(body.error ? body.error.message : `the server answered ${response.status}`, true); return; }
    state.results = body.results;
    drawAll();
    setStatus('');
  } catch (error) {
    if (error.name === 'AbortError') return;
    setStatus(`could not reach the server: ${error.message}`, true);
  } finally {
    if (sequence === state.sequence) {
      panels.dataset.textLength = String(codePoints(text)); // what the characters count says, for tests and tools
      panels.dataset.mode = state.mode;
      panels.setAttribute('aria-busy', 'false');
    }
  }
}

function scheduleEncode() {
  clearTimeout(state.timer);
  $('#panels').setAttribute('aria-busy', 'true');
  state.timer = setTimeout(encodeNow, DEBOUNCE_MS);
}

// The link: #mode=chat&t=gpt2&t=cl100k_base&ids=1&text=... (text left out when long).
function saveFragment(text) {
  const params = new URLSearchParams();
  params.set('mode', state.mode);
  state.chosen.forEach((name) => params.append('t', name));
  if (state.showIds) params.set('ids', '1');
  if (text.length <= LINK_TEXT_LIMIT) params.set('text', text);
  history.replaceState(null, '', '#' + params.toString());
  $('#copy-link').title = text.length <= LINK_TEXT_LIMIT ? 'The link holds the text, the mode and the tokenizers'
    : `The text is over ${LINK_TEXT_LIMIT.toLocaleString('en-US')} characters: the link keeps only the mode and tokenizers`;
}

function restoreFragment() {
  const params = new URLSearchParams(location.hash.slice(1));
  const named = params.getAll('t').filter((name) => state.all.includes(name));
  state.chosen = named.length ? named : state.all.slice();
  state.mode = params.get('mode') === 'chat' ? 'chat' : 'text';
  state.showIds = params.get('ids') === '1';
  $('#input').value = params.has('text') ? params.get('text')
    : state.mode === 'chat' ? 'system: Be brief.\nuser: What is 2+2?\nassistant: 4' : '';
}

function buildControls() {
  const choices = $('#choices');
  for (const name of state.all) {
    const label = document.createElement('label');
    const box = document.createElement('input');
    box.type = 'checkbox';
    box.value = name;
    box.checked = state.chosen.includes(name);
    box.addEventListener('change', () => {
      state.chosen = state.all.filter((n) => choices.querySelector(`input[value="${CSS.escape(n)}"]`).checked);
      scheduleEncode();
    });
    label.append(box, ' ', shortName(name));
    label.title = name;
    choices.append(label);
  }
  for (const radio of document.querySelectorAll('input[name=mode]')) {
    radio.checked = radio.value === state.mode;
    radio.addEventListener('change', () => { state.mode = radio.value; $('#chat-help').hidden = state.mode !== 'chat'; scheduleEncode(); });
  }
  $('#chat-help').hidden = state.mode !== 'chat';
  $('#show-ids').checked = state.showIds;
  $('#show-ids').addEventListener('change', () => { state.showIds = $('#show-ids').checked; saveFragment($('#input').value); drawAll(); });
  $('#input').addEventListener('input', scheduleEncode);
  $('#copy-link').addEventListener('click', () => {
    navigator.clipboard.writeText(location.href).then(() => setStatus('Link copied.'), () => setStatus(location.href));
  });
}

async function start() {
  try {
    const response = await fetch('api/tokenizers');
    state.all = (await response.json()).tokenizers;
  } catch (error) {
    setStatus(`could not reach the server: ${error.message}`, true);
    return;
  }
  restoreFragment();
  buildControls();
  encodeNow();
}

start();
