// The pool heatmap: every GPU one small cell, written straight into one ImageData (one pass,
// no per-cell canvas call), so 100,000 GPUs draw in a few tens of milliseconds.
//
// Layout: zones one under the other (a label row each); within a zone, racks left to right
// (a wider gap between racks) and nodes left to right, wrapping at the canvas width; a node is a
// column of its GPUs by index, with a one-pixel gap where the NVLink domain changes.
// A cell's left half is its VRAM allocated, its right half its SM allocated; a faulty GPU is
// red; a cordoned node's GPUs are greyed with a dark top edge.

const NODE_GAP = 1;
const RACK_GAP = 4;
const LINE_GAP = 4;
const LABEL_ROW = 14;

function colour(r, g, b) {
  return (255 << 24) | (b << 16) | (g << 8) | r; // ImageData is RGBA bytes: little-endian ABGR
}

// 0 (free) to 1 (fully allocated): light blue, to blue, to dark navy.
const SCALE = Array.from({ length: 101 }, (_, i) => {
  const t = i / 100;
  const stops = [[232, 240, 255], [70, 110, 230], [20, 30, 110]];
  const [a, b, u] = t < 0.5 ? [stops[0], stops[1], t * 2] : [stops[1], stops[2], (t - 0.5) * 2];
  const mix = (k) => Math.round(a[k] + (b[k] - a[k]) * u);
  return [mix(0), mix(1), mix(2)];
});
const LUT = Uint32Array.from(SCALE, ([r, g, b]) => colour(r, g, b));
const GREY = Uint32Array.from(SCALE, ([r, g, b]) => {
  const y = Math.round((r + g + b) / 3);
  return colour(Math.round((y + 150) / 2), Math.round((y + 150) / 2), Math.round((y + 150) / 2));
});
const FAULT = colour(220, 30, 30);
const EDGE = colour(60, 60, 60);
const WHITE = colour(255, 255, 255);

export function layoutPool(cells, width) {
  const size = cells.length > 40000 ? 3 : cells.length > 5000 ? 4 : 8;
  const half = Math.ceil(size / 2);
  cells.sort((a, b) => (a.zone < b.zone ? -1 : a.zone > b.zone ? 1 : a.rack < b.rack ? -1 : a.rack > b.rack ? 1
    : a.node < b.node ? -1 : a.node > b.node ? 1 : a.index - b.index));
  // Nodes in order, each with its cells' vertical offsets.
  const nodes = [];
  let current = null;
  let tallest = 0;
  for (let i = 0; i < cells.length; i++) {
    const c = cells[i];
    if (!current || current.name !== c.node) {
      current = { name: c.node, zone: c.zone, rack: c.rack, cells: [], offsets: [], height: 0, x: 0, y: 0 };
      nodes.push(current);
    } else if (cells[i - 1].domain !== c.domain) {
      current.height += 1;
    }
    current.cells.push(i);
    current.offsets.push(current.height);
    current.height += size;
    if (current.height > tallest) tallest = current.height;
  }
  const lines = [];
  const labels = [];
  let x = 0, y = 0, line = null, zone = null, rack = null;
  const newLine = () => {
    if (line) y = line.y1 + LINE_GAP;
    line = { y0: y, y1: y + tallest, nodes: [] };
    lines.push(line);
    x = 0;
  };
  for (const node of nodes) {
    if (node.zone !== zone) {
      if (line) y = line.y1 + LINE_GAP;
      labels.push({ text: `zone ${node.zone || "—"}`, x: 0, y: y + LABEL_ROW - 3 });
      y += LABEL_ROW;
      line = null;
      newLine();
      zone = node.zone;
      rack = node.rack;
    } else if (node.rack !== rack) {
      x += RACK_GAP;
      rack = node.rack;
    }
    if (x + size > width) newLine();
    node.x = x;
    node.y = line.y0;
    line.nodes.push(node);
    x += size + NODE_GAP;
  }
  const height = line ? line.y1 + 2 : 10;
  return {
    cells, nodes, lines, labels, size, half, width, height,
    at(px, py) {
      let lo = 0, hi = lines.length - 1, found = null;
      while (lo <= hi) {
        const mid = (lo + hi) >> 1;
        if (py < lines[mid].y0) hi = mid - 1;
        else if (py >= lines[mid].y1) lo = mid + 1;
        else { found = lines[mid]; break; }
      }
      if (!found) return null;
      const list = found.nodes;
      lo = 0; hi = list.length - 1;
      while (lo <= hi) {
        const mid = (lo + hi) >> 1;
        const n = list[mid];
        if (px < n.x) hi = mid - 1;
        else if (px >= n.x + size) lo = mid + 1;
        else {
          const dy = py - n.y;
          for (let k = 0; k < n.offsets.length; k++)
            if (dy >= n.offsets[k] && dy < n.offsets[k] + size) return cells[n.cells[k]];
          return null;
        }
      }
      return null;
    },
  };
}

export function drawHeatmap(canvas, layout) {
  const { width, height, size, half, nodes, cells } = layout;
  canvas.width = width;
  canvas.height = height;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(width, height);
  const px = new Uint32Array(image.data.buffer);
  px.fill(WHITE);
  for (let n = 0; n < nodes.length; n++) {
    const node = nodes[n];
    for (let k = 0; k < node.cells.length; k++) {
      const c = cells[node.cells[k]];
      const x0 = node.x, y0 = node.y + node.offsets[k];
      const lut = c.cordoned ? GREY : LUT;
      const left = c.faulty ? FAULT : lut[Math.max(0, Math.min(100, Math.round(c.vram * 100)))];
      const right = c.faulty ? FAULT : lut[Math.max(0, Math.min(100, Math.round(c.sm * 100)))];
      for (let dy = 0; dy < size; dy++) {
        const rowStart = (y0 + dy) * width + x0;
        const edge = c.cordoned && dy === 0;
        for (let dx = 0; dx < size; dx++) px[rowStart + dx] = edge ? EDGE : dx < half ? left : right;
      }
    }
  }
  ctx.putImageData(image, 0, 0);
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#344054";
  for (const label of layout.labels) ctx.fillText(label.text, label.x, label.y);
}
