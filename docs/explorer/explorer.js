// attnkit's explorer in the browser: a tiny decoder (model.onnx, built by docs/hooks/explorer_model.py) run by
// onnxruntime-web from this site's own files (vendor/, copied from npm's package when the site is built): nothing
// is installed and nothing is fetched from another host. Type a text; the page runs the whole model on it and draws
// each layer's and head's attention, the next-token distribution at the last position, and the whole model's flow
// (embedding, each block's attention and FFN, the residual stream, the output) with each stage's shape for the text.
// `window.attnkitExplorer` holds the state and `analyze(text)`, which the site's test drives.
const $ = (id) => document.getElementById(id);
const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
const LABEL_FONT = "14px sans-serif", SCALE_WIDTH = 16, MOST_NEW_TOKENS = 16;
const state = { ready: false, error: null, meta: null, ids: [], tokens: [], attention: [], probabilities: [],
                residualNorms: [], flow: [], layer: 0, head: null };
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
// graph has them, the norm of the last token's residual stream after each block (its (T, C) output's last row).
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
  const out = await session.run(feeds, ["logits", ...m.attention_outputs, ...residual]);
  const attention = m.attention_outputs.map((name) => {
    const data = out[name].data, H = out[name].dims[1];
    return Array.from({ length: H }, (_, h) => Array.from({ length: T }, (_, i) =>
      Array.from(data.subarray((h * T + i) * T, (h * T + i + 1) * T))));
  });
  const V = out.logits.dims[2], last = Array.from(out.logits.data.subarray((T - 1) * V, T * V));
  const top = Math.max(...last), exp = last.map((x) => Math.exp(x - top)), sum = exp.reduce((a, b) => a + b, 0);
  const residualNorms = residual.map((name) => {
    const C = out[name].dims[2];
    return Math.hypot(...out[name].data.subarray((T - 1) * C, T * C));
  });
  return { attention, probabilities: exp.map((x) => x / sum), residualNorms };
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
  const scaleX = margin + T * cell + 20;
  canvas.width = scaleX + SCALE_WIDTH + 60;
  canvas.height = margin + T * cell + 10;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  const max = Math.max(...w.flat()) || 1;
  w.forEach((row, i) => row.forEach((x, j) => {
    ctx.fillStyle = colour(x / max);
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
  for (let k = 0; k < T * cell; k++) {  // the colour scale, 0 at the bottom to the largest weight at the top
    ctx.fillStyle = colour(1 - k / (T * cell - 1));
    ctx.fillRect(scaleX, margin + k, SCALE_WIDTH, 1);
  }
  ctx.fillStyle = "#222";
  ctx.textAlign = "left";
  ctx.textBaseline = "middle";
  for (let k = 0; k <= 4; k++) ctx.fillText((max * k / 4).toFixed(2), scaleX + SCALE_WIDTH + 6, margin + T * cell * (1 - k / 4));
  canvas.onmousemove = (event) => {
    const box = canvas.getBoundingClientRect();
    const j = Math.floor((event.clientX - box.left - margin) / cell), i = Math.floor((event.clientY - box.top - margin) / cell);
    $("explorer-readout").textContent = i >= 0 && i < T && j >= 0 && j < T
      ? `query ${i} "${labels[i]}" -> key ${j} "${labels[j]}": ${w[i][j].toFixed(4)}` : "";
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
// Sizes and architecture come from model.json (the hook writes them from the model's config), T from the text.
function flowStages() {
  const m = state.meta, T = state.tokens.length, C = m.d_model, V = m.vocab_size || m.pieces.length;
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
      `; the residual stream after block ${layer}: ‖x‖ = ${stream.toFixed(2)} at "${shown(state.tokens[T - 1])}"`;
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

function draw() {
  drawControls();
  drawHeatmap();
  drawNext();
  drawFlow();
}

$("explorer-text").addEventListener("input", () => { if (state.ready) analyze($("explorer-text").value); });
$("explorer-complete").addEventListener("click", () => { if (state.ready) complete(); });
$("explorer-layer").addEventListener("change", (event) => { state.layer = Number(event.target.value); draw(); });
state.analyze = analyze;
state.loaded = load().catch((error) => fail(`the model did not load: ${error.message}`));
window.attnkitExplorer = state;
