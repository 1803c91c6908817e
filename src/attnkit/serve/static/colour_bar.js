// The colour bar beside an attention heatmap, one file for the three pages that draw one: the explorer loads it
// from /static/, the attention page (viz/page.py) carries it inline, and the site's explorer gets a copy when the
// site is built (docs/hooks/generated.py). A plain script: its functions are globals of the page that loads it.
"use strict";

const COLOUR_BAR_TOP_GAP = 1 / 6;  // a round tick nearer the top than this share of the bar gives way to the top's

// The bar's ticks from 0 up to `max`: round weights (1, 2, 2.5 or 5 times a power of ten; 3 to 6 of them) printed as
// they are (0.025, not 0.03, which misstates its height), and the top labelled with `max` itself to three figures,
// so a map up to 0.37 reads 0 0.1 0.2 0.3 0.37, not a top that reads as nothing. Each tick: its value, its height on
// the bar (0 the bottom, 1 the top) and its label. A map of zeros has one tick, "all zero"; a `max` that is not a
// positive number (NaN) has none.
function colourBarTicks(max) {
  if (max === 0) return [{ value: 0, height: 0, label: "all zero" }];
  if (!(max > 0 && Number.isFinite(max))) return [];
  const raw = max / 5, power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((s) => s >= raw * (1 - 1e-9));
  const ticks = [];
  for (let k = 0; k * step <= max * (1 - COLOUR_BAR_TOP_GAP); k++) {
    const value = k * step;
    ticks.push({ value, height: value / max, label: String(Number(value.toPrecision(6))) });
  }
  ticks.push({ value: max, height: 1, label: String(Number(max.toPrecision(3))) });
  return ticks;
}

// Draw the bar on `ctx` at `x`, from `top` down `height` px, `width` px wide: `colour(t)` (t in [0, 1]) from the
// largest weight `max` at the top to 0 at the bottom (a map of zeros: all the colour of 0), an outline so its light
// end stands apart from the page, and a tick mark and label (in `font`) per tick. Returns where each tick was drawn:
// { top, height, ticks: [{ value, height, label, y }] }, y = top + (1 - value / max) * (height - 1).
function drawColourBar(ctx, { x, top, width, height, max, colour, font }) {
  const ticks = colourBarTicks(max).map((tick) => ({ ...tick, y: top + (1 - tick.height) * (height - 1) }));
  for (let k = 0; k < height; k++) {
    ctx.fillStyle = colour(max > 0 ? 1 - k / (height - 1) : 0);
    ctx.fillRect(x, top + k, width, 1);
  }
  ctx.strokeStyle = "#888";
  ctx.lineWidth = 1;
  ctx.strokeRect(x + 0.5, top + 0.5, width - 1, height - 1);
  ctx.fillStyle = "#222";
  ctx.font = font;
  ctx.textAlign = "left";
  ctx.textBaseline = "middle";
  for (const tick of ticks) {
    ctx.fillRect(x + width, Math.round(tick.y), 4, 1);
    ctx.fillText(tick.label, x + width + 8, tick.y);  // apart from its tick, not read as a minus
  }
  return { top, height, ticks };
}
