// attnkit's explorer in the browser: a tiny decoder (model.onnx, built by docs/hooks/explorer_model.py) run by
// onnxruntime-web from this site's own files (vendor/, copied from npm's package when the site is built): nothing
// is installed and nothing is fetched from another host. Type a text; the page runs the whole model on it and draws
// each layer's and head's attention, the next-token distribution at the last position, and the whole model's flow
// (embedding, each block's attention and FFN, the residual stream, the output) with each stage's shape for the text,
// and at a chosen token the residual stream's norms and the numbers inside: a head's query, keys and values, the dot
// products that make its scores, the softmax before and after the causal mask, the FFN's hidden activations, and the
// logits with a temperature.
// `window.attnkitExplorer` holds the state and `analyze(text)`, which the site's test drives.
const $ = (id) => document.getElementById(id);
const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
const LABEL_FONT = "14px sans-serif", SCALE_WIDTH = 16, MOST_NEW_TOKENS = 16, LOGITS_SHOWN = 8;
const SCALE_MIN_HEIGHT = 120;  // px: the colour scale's labels stand apart however few rows the heatmap has
const NEGATIVE = [33, 102, 172], POSITIVE = [178, 24, 43];  // the vectors' cells: blue below 0, red above, white at 0
const DETAIL = ["query", "key", "value", "scores", "hidden"];  // model.json's `{kind}_outputs`, one name a layer
const state = { ready: false, error: null, meta: null, ids: [], tokens: [], attention: [], probabilities: [],
                residualNorms: [], flow: [], scale: null, layer: 0, head: null, token: null, temperature: 1, detail: [],
                logits: null, inside: null };
let ort = null, session = null, charIds = new Map();

function fail(message) {
  state.error = message;
  $("explorer-message").textContent = message;
}

async function load() {
  try {
    ort = await import("./vendor/ort.wasm.bundle.min.mjs");
  } catch (error) {
    fail("onnxruntime-web is not in this build of the site: run `npm install` in the repository, then `make docs` " +
         `(${error.message})`);
    return;
  }
  ort.env.wasm.numThreads = 1;  // no SharedArrayBuffer needed, so any static server will do
  // the bundle carries its glue code and finds its .wasm beside itself, in vendor/
  state.meta = await (await fetch(new URL("model.json", import.meta.url))).json();
  state.meta.pieces.forEach((piece, id) => { if ([...piece].length === 1) charIds.set(piece, id); });
  session = await ort.InferenceSession.create(new URL("model.onnx", import.meta.url).href,
                                              { executionProviders: ["wasm"] });
  const trained = state.meta.task_symbols || [...charIds.keys()];
  $("explorer-alphabet").textContent = trained.join(" ");
  $("explorer-text").value = state.meta.example.text;
  state.ready = true;
  await analyze($("explorer-text").value);
}

function encode(text) {
  const ids = [];
  for (const char of text) {
    if (!charIds.has(char)) throw new Error(`"${char}" is not in the model's alphabet (below)`);
    ids.push(charIds.get(char));
  }
  if (ids.length === 0) throw new Error("type at least one character");
  if (ids.length > state.meta.max_seq_len) throw new Error(`at most ${state.meta.max_seq_len} characters`);
  return ids;
}

// One pass of the graph over `ids` with an empty KV cache: the logits, each layer's (H, T, T) weights and, where the
// graph has them, the norm of every token's residual stream after each block (each row of its (T, C) output) and
// what the numbers panel reads (`detail`, `logits`).
async function run(ids) {
  const m = state.meta, T = ids.length;
  const feeds = {
    input_ids: new ort.Tensor("int64", BigInt64Array.from(ids, BigInt), [1, T]),
    attention_mask: new ort.Tensor("int64", new BigInt64Array(T).fill(1n), [1, T]),
  };
  const empty = new ort.Tensor("float32", new Float32Array(0), [1, m.n_kv_heads, 0, m.head_dim]);
  for (let layer = 0; layer < m.n_layers; layer++) {
    feeds[`past_key_values.${layer}.key`] = empty;
    feeds[`past_key_values.${layer}.value`] = empty;
  }
  const residual = m.residual_outputs || [];
  const detail = DETAIL.every((kind) => m[`${kind}_outputs`]) ? DETAIL.flatMap((kind) => m[`${kind}_outputs`]) : [];
  const out = await session.run(feeds, ["logits", ...m.attention_outputs, ...residual, ...detail]);
  const attention = m.attention_outputs.map((name) => {
    const data = out[name].data, H = out[name].dims[1];
    return Array.from({ length: H }, (_, h) => Array.from({ length: T }, (_, i) =>
      Array.from(data.subarray((h * T + i) * T, (h * T + i + 1) * T))));
  });
  const V = out.logits.dims[2], last = Array.from(out.logits.data.subarray((T - 1) * V, T * V));
  const residualNorms = residual.map((name) => {  // per block, (T,): ‖x_t‖ of the stream leaving it
    const C = out[name].dims[2];
    return Array.from({ length: T }, (_, t) => Math.hypot(...out[name].data.subarray(t * C, (t + 1) * C)));
  });
  // per layer, the flat arrays in the graph's layouts: query, key, value (H, T, D), scores (H, T, T), hidden (T, d_ff)
  const perLayer = detail.length === 0 ? [] : Array.from({ length: m.n_layers }, (_, layer) =>
    Object.fromEntries(DETAIL.map((kind) => [kind, out[m[`${kind}_outputs`][layer]].data])));
  return { attention, probabilities: softmax(last), residualNorms, detail: perLayer,
           logits: { data: out.logits.data, V } };
}

async function analyze(text) {
  $("explorer-message").textContent = "";
  let ids;
  try {
    ids = encode(text);
  } catch (error) {
    fail(error.message);
    return;
  }
  const result = await run(ids);
  Object.assign(state, { ids, tokens: ids.map((id) => state.meta.pieces[id]), ...result, error: null });
  if (state.token !== null && state.token >= ids.length) state.token = null;
  draw();
}

// Greedy decoding: the most likely token, appended, until EOS (each step runs the whole text again).
async function complete() {
  let text = $("explorer-text").value;
  for (let step = 0; step < MOST_NEW_TOKENS; step++) {
    await analyze(text);
    if (state.error) return;
    const best = state.probabilities.indexOf(Math.max(...state.probabilities));
    if (best === state.meta.eos || !charIds.has(state.meta.pieces[best])) break;
    text += state.meta.pieces[best];
    $("explorer-text").value = text;
  }
  await analyze(text);
}

function colour(t) {  // t in [0, 1] -> viridis
  const x = Math.min(Math.max(t, 0), 1) * (VIRIDIS.length - 1), i = Math.min(Math.floor(x), VIRIDIS.length - 2);
  const f = x - i, a = VIRIDIS[i], b = VIRIDIS[i + 1];
  return `rgb(${a.map((c, k) => Math.round(c + f * (b[k] - c))).join(",")})`;
}

// (T, T) weights of the chosen layer and head, or the mean over the heads (head null).
function weights() {
  const heads = state.attention[state.layer], chosen = state.head === null ? heads : [heads[state.head]];
  return heads[0].map((row, i) => row.map((_, j) => chosen.reduce((sum, h) => sum + h[i][j], 0) / chosen.length));
}

function drawControls() {
  const layer = $("explorer-layer");
  if (layer.options.length !== state.meta.n_layers) {
    layer.replaceChildren(...Array.from({ length: state.meta.n_layers }, (_, l) => new Option(`${l}`, l)));
  }
  layer.value = state.layer;
  const button = (label, head) => {
    const b = document.createElement("button");
    b.textContent = label;
    b.dataset.head = head === null ? "mean" : head;
    b.className = state.head === head ? "selected" : "";
    b.addEventListener("click", () => { state.head = head; draw(); });
    return b;
  };
  $("explorer-heads").replaceChildren(button("mean", null),
    ...Array.from({ length: state.meta.n_heads }, (_, h) => button(`${h}`, h)));
}

function drawHeatmap() {
  const w = weights(), T = state.tokens.length, labels = state.tokens.map((t) => (t === " " ? "␣" : t));
  const canvas = $("explorer-heatmap"), ctx = canvas.getContext("2d");
  const cell = Math.max(16, Math.min(36, Math.floor(560 / T)));
  ctx.font = LABEL_FONT;
  const margin = 16 + Math.max(...labels.map((t) => ctx.measureText(t).width));
  const scaleX = margin + T * cell + 20, scaleHeight = Math.max(T * cell, SCALE_MIN_HEIGHT);
  canvas.width = scaleX + SCALE_WIDTH + 60;
  canvas.height = margin + scaleHeight + 10;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  const max = Math.max(...w.flat());
  w.forEach((row, i) => row.forEach((x, j) => {
    ctx.fillStyle = colour(max > 0 ? x / max : 0);
    ctx.fillRect(margin + j * cell, margin + i * cell, cell, cell);
  }));
  ctx.font = LABEL_FONT;
  ctx.fillStyle = "#222";
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  labels.forEach((t, i) => ctx.fillText(t, margin - 6, margin + (i + 0.5) * cell));
  ctx.textAlign = "center";
  ctx.textBaseline = "bottom";
  labels.forEach((t, j) => ctx.fillText(t, margin + (j + 0.5) * cell, margin - 4));
  // the colour scale, 0 at the bottom to the largest weight at the top (colour_bar.js, the served explorer's)
  state.scale = drawColourBar(ctx, { x: scaleX, top: margin, width: SCALE_WIDTH, height: scaleHeight, max, colour,
                                     font: LABEL_FONT });
  canvas.onmousemove = (event) => {
    const box = canvas.getBoundingClientRect();
    const j = Math.floor((event.clientX - box.left - margin) / cell), i = Math.floor((event.clientY - box.top - margin) / cell);
    $("explorer-readout").textContent = i >= 0 && i < T && j >= 0 && j < T
      ? `query ${i} "${labels[i]}" -> key ${j} "${labels[j]}": ${w[i][j].toFixed(4)}` : "";
  };
  canvas.onclick = (event) => {  // a row: the query token whose numbers the panel below shows
    const i = Math.floor((event.clientY - canvas.getBoundingClientRect().top - margin) / cell);
    if (i >= 0 && i < T) { state.token = i; draw(); }
  };
}

function drawNext() {
  const ranked = state.probabilities.map((p, id) => [p, id]).sort((a, b) => b[0] - a[0]).slice(0, 5);
  $("explorer-next").replaceChildren(...ranked.map(([p, id]) => {
    const row = document.createElement("tr");
    const piece = state.meta.pieces[id];
    row.innerHTML = `<td></td><td><span class="explorer-bar" style="width:${Math.round(p * 200)}px"></span></td>` +
                    `<td>${p.toFixed(3)}</td>`;
    row.firstChild.textContent = piece === " " ? "␣" : piece;
    return row;
  }));
}

// The whole model as stages, in order, for the current text: {name, shape, note, block} (block: its layer, or null).
// Sizes and architecture come from model.json (the hook writes them from the model's config), T from the text; the
// residual stream's norms are read at the chosen token (Token, or a click on a row of the map; the last by default).
function flowStages() {
  const m = state.meta, T = state.tokens.length, C = m.d_model, V = m.vocab_size || m.pieces.length;
  const t = state.token ?? T - 1;
  const norm = m.norm === "rms" ? "RMSNorm" : "LayerNorm", pre = m.norm_position === "pre";
  const shown = (t) => (t === " " ? "␣" : t);
  const inside = { rope: "; RoPE rotates q and k inside", alibi: "; ALiBi biases the scores",
                   relative: "; relative positions bias the scores and values" }[m.position] || "";
  const stages = [
    { name: "tokens", shape: [T], note: state.tokens.map(shown).join(" ") },
    { name: "token embedding", shape: [T, C], note: `a row of the (${V}, ${C}) table per token` },
  ];
  if (["learned", "sinusoidal"].includes(m.position)) {
    stages.push({ name: `+ ${m.position} position embedding`, shape: [T, C], note: "added to the token embeddings" });
  }
  const residual = (sublayer, layer) => {
    const out = [];
    if (pre) out.push({ name: norm, shape: [T, C], note: "pre-norm: on the sublayer's input", block: layer });
    out.push(sublayer);
    out.push({ name: "+ residual", shape: [T, C], note: `x + ${sublayer.short}(${pre ? "norm(x)" : "x"})`, block: layer });
    if (!pre) out.push({ name: norm, shape: [T, C], note: "post-norm: after the sum", block: layer });
    return out;
  };
  for (let layer = 0; layer < m.n_layers; layer++) {
    stages.push(...residual({ name: "self-attention", short: "attention", shape: [T, C], block: layer,
      note: `${m.n_heads} heads of ${m.head_dim}: weights (${m.n_heads}, ${T}, ${T}), causal${inside}` }, layer));
    stages.push(...residual({ name: "feed-forward", short: "FFN", shape: [T, C], block: layer,
      note: `${C} → ${m.d_ff} → ${C}, ${m.activation} between: (${T}, ${m.d_ff}) inside` }, layer));
    const stream = state.residualNorms[layer];
    stages[stages.length - 1].note += stream === undefined ? "" :
      `; the residual stream after block ${layer}: ‖x‖ = ${stream[t].toFixed(2)} at token ${t} ` +
      `"${shown(state.tokens[t])}"`;
  }
  if (m.final_norm) stages.push({ name: `final ${norm}`, shape: [T, C], note: "" });
  stages.push({ name: "output layer", shape: [T, V],
                note: m.tie_embeddings ? "logits: the embedding table, reused (tied)" : "logits" });
  const best = state.probabilities.indexOf(Math.max(...state.probabilities));
  stages.push({ name: "softmax: next token", shape: [V], note: `at the last position: "${shown(m.pieces[best])}", ` +
                `p = ${state.probabilities[best].toFixed(3)}` });
  return stages.map((stage) => ({ block: null, ...stage, shape: `(${stage.shape.join(", ")})` }));
}

function drawFlow() {
  state.flow = flowStages();
  const rows = [];
  let group = null;
  for (const stage of state.flow) {
    const row = document.createElement("div");
    row.className = "explorer-stage";
    row.dataset.stage = stage.name;
    for (const [cls, text] of [["explorer-stage-name", stage.name], ["explorer-shape", stage.shape],
                               ["explorer-stage-note", stage.note]]) {
      const cell = document.createElement(cls === "explorer-shape" ? "code" : "span");
      cell.className = cls;
      cell.textContent = text;
      row.append(cell);
    }
    if (stage.block === null) {
      group = null;
      rows.push(row);
      continue;
    }
    if (group === null || Number(group.dataset.block) !== stage.block) {
      group = document.createElement("div");
      group.className = "explorer-block";
      group.dataset.block = stage.block;
      group.append(Object.assign(document.createElement("div"), { className: "explorer-block-name",
                                                                   textContent: `block ${stage.block}` }));
      rows.push(group);
    }
    group.append(row);
  }
  $("explorer-flow").replaceChildren(...rows);
}

function softmax(xs) {  // masked entries (-Infinity) get weight 0
  const top = Math.max(...xs), exp = xs.map((x) => Math.exp(x - top)), sum = exp.reduce((a, b) => a + b, 0);
  return exp.map((x) => x / sum);
}

// What the numbers panel shows at the chosen token t (null: the last) of the chosen layer, for the chosen head (head
// 0 while the maps show the mean): every value read from the graph's outputs or computed here from them.
function insideNumbers() {
  const m = state.meta, T = state.tokens.length, D = m.head_dim, F = m.d_ff, { V } = state.logits;
  const t = state.token ?? T - 1, head = state.head ?? 0, d = state.detail[state.layer];
  const row = (data, i, width) => Array.from(data.subarray(i * width, (i + 1) * width));
  const kvHead = Math.floor(head * m.n_kv_heads / m.n_heads);  // the key-value head this query head reads (GQA)
  const keys = Array.from({ length: T }, (_, j) => row(d.key, kvHead * T + j, D));
  const query = row(d.query, head * T + t, D);
  const dots = keys.map((k) => k.reduce((sum, x, i) => sum + x * query[i], 0));  // q · k_j
  const scores = row(d.scores, head * T + t, T);  // the graph's: q · k_j / sqrt(D)
  const masked = scores.map((s, j) => (j <= t ? s : -Infinity));  // the causal mask: no key after the query
  const logits = row(state.logits.data, t, V);
  return { layer: state.layer, head, token: t, query, keys, dots, scores, masked,
           values: Array.from({ length: T }, (_, j) => row(d.value, kvHead * T + j, D)),
           unmasked: softmax(scores), weights: softmax(masked), hidden: row(d.hidden, t, F), logits,
           temperature: state.temperature, probabilities: softmax(logits.map((x) => x / state.temperature)) };
}

function element(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

function holding(tag, child) {
  const e = document.createElement(tag);
  e.append(child);
  return e;
}

function diverging(x, scale) {  // x / scale in [-1, 1] -> blue, white, red
  const f = Math.min(Math.abs(x) / (scale || 1), 1), end = x < 0 ? NEGATIVE : POSITIVE;
  return `rgb(${end.map((c) => Math.round(255 + f * (c - 255))).join(",")})`;
}

// A vector as a row of small cells coloured by value (full colour at `scale`: by default its largest magnitude),
// each value on hover.
function cells(values, label, { scale = largest(values), className = "explorer-vector" } = {}) {
  const box = element("span", className);
  values.forEach((x, i) => {
    const cell = element("span");
    cell.style.background = diverging(x, scale);
    cell.title = `${label}[${i}] = ${x.toFixed(4)}`;
    box.append(cell);
  });
  return box;
}

const largest = (values) => Math.max(...values.map(Math.abs));
const fixed = (x, digits = 2) => (x === -Infinity ? "−∞" : x.toFixed(digits));

function drawSteps(n) {
  const m = state.meta, labels = state.tokens.map((t) => (t === " " ? "␣" : t)), D = m.head_dim;
  const q = `q (token ${n.token} "${labels[n.token]}")`;
  $("explorer-steps-title").textContent = `Layer ${n.layer}, head ${n.head}${state.head === null ? " (pick a head " +
    "above; the maps show the mean)" : ""}, at token ${n.token} "${labels[n.token]}": each key's score is q · k / √${D}`;
  const query = element("p", "explorer-query");
  query.append(element("span", "explorer-label", `${q} after RoPE`), cells(n.query, "q"));
  const table = element("table", "explorer-steps");
  const keyScale = largest(n.keys.flat()), valueScale = largest(n.values.flat());  // one colour scale for each column
  const head = element("tr");
  for (const name of ["key", `k after RoPE (${D})`, "q · k", `÷ √${D}`, "+ mask", "softmax, no mask",
                      "softmax, masked", `v (${D})`]) head.append(element("th", "", name));
  table.append(head);
  n.keys.forEach((k, j) => {
    const tr = element("tr", j > n.token ? "explorer-masked" : "");
    tr.append(element("td", "", `${j} "${labels[j]}"`));
    tr.append(holding("td", cells(k, `k${j}`, { scale: keyScale })));
    for (const x of [n.dots[j], n.scores[j], n.masked[j]]) tr.append(element("td", "explorer-number", fixed(x)));
    for (const p of [n.unmasked[j], n.weights[j]]) {
      const td = element("td", "explorer-number", p.toFixed(3));
      td.style.background = `rgba(33, 102, 172, ${(0.6 * p).toFixed(3)})`;
      tr.append(td);
    }
    tr.append(holding("td", cells(n.values[j], `v${j}`, { scale: valueScale })));
    table.append(tr);
  });
  $("explorer-steps").replaceChildren(query, table);
}

function drawHidden(n) {
  const m = state.meta, ranked = n.hidden.map((x, i) => [x, i]).sort((a, b) => b[0] - a[0]);
  const active = n.hidden.filter((x) => x > 0.1).length;
  $("explorer-hidden-title").textContent = `The FFN's ${m.d_ff} hidden activations (${m.activation}) in block ` +
    `${n.layer} at token ${n.token}: ${active} above 0.1; the largest ` +
    ranked.slice(0, 3).map(([x, i]) => `#${i} = ${x.toFixed(2)}`).join(", ");
  $("explorer-hidden").replaceChildren(cells(n.hidden, "hidden", { className: "explorer-grid" }));
}

function drawLogits(n) {
  const m = state.meta, shown = (p) => (p === " " ? "␣" : p);
  $("explorer-temperature").value = n.temperature;
  $("explorer-temperature-value").textContent = n.temperature.toFixed(1);
  $("explorer-logits-title").textContent = `The logits at token ${n.token} (what comes after it), and softmax(logits ` +
    `/ ${n.temperature.toFixed(1)}): below 1 the temperature sharpens the distribution, above 1 it flattens it`;
  const ranked = n.logits.map((x, id) => [x, id]).sort((a, b) => b[0] - a[0]).slice(0, LOGITS_SHOWN);
  const head = element("tr");
  for (const name of ["token", "logit", "probability"]) head.append(element("th", "", name));
  $("explorer-logits").replaceChildren(head, ...ranked.map(([x, id]) => {
    const tr = element("tr"), p = n.probabilities[id];
    tr.append(element("td", "", shown(m.pieces[id])), element("td", "explorer-number", x.toFixed(2)));
    const bar = element("td");
    bar.innerHTML = `<span class="explorer-bar" style="width:${Math.round(p * 200)}px"></span> ${p.toFixed(3)}`;
    tr.append(bar);
    return tr;
  }));
}

function drawInside() {
  $("explorer-inside").hidden = state.detail.length === 0;
  if (state.detail.length === 0) return;
  const labels = state.tokens.map((t) => (t === " " ? "␣" : t)), T = labels.length;
  $("explorer-token").replaceChildren(...labels.map((t, j) => new Option(`${j} "${t}"`, j)));
  $("explorer-token").value = state.token ?? T - 1;
  state.inside = insideNumbers();
  drawSteps(state.inside);
  drawHidden(state.inside);
  drawLogits(state.inside);
}

function draw() {
  drawControls();
  drawHeatmap();
  drawNext();
  drawFlow();
  drawInside();
}

$("explorer-text").addEventListener("input", () => { if (state.ready) analyze($("explorer-text").value); });
$("explorer-complete").addEventListener("click", () => { if (state.ready) complete(); });
$("explorer-layer").addEventListener("change", (event) => { state.layer = Number(event.target.value); draw(); });
$("explorer-token").addEventListener("change", (event) => { state.token = Number(event.target.value); draw(); });
$("explorer-temperature").addEventListener("input", (event) => {
  state.temperature = Number(event.target.value);
  draw();
});
// The test's way in: choose a layer, head (null: the mean), token (null: the last) and temperature, and redraw.
state.show = (choice) => { Object.assign(state, choice); draw(); return state.inside; };
state.analyze = analyze;
state.loaded = load().catch((error) => fail(`the model did not load: ${error.message}`));
window.attnkitExplorer = state;
