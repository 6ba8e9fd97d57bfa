// The overview charts of /qa, from GET /api/overview: voice-to-voice p50/p95/p99, the p50 of each
// latency mark, and turns with the draft acceptance rate, per time bucket. Chart.js is the vendored
// UMD build (window.Chart, app/static/vendor/).

const PERCENTILES = [
  {key: "v2v_p50", label: "p50", color: "#2f6fed"},
  {key: "v2v_p95", label: "p95", color: "#e67e22"},
  {key: "v2v_p99", label: "p99", color: "#c0392b"},
];

// Bucket starts as local clock times, with the date when the window spans more than a day.
function bucketLabels(overview) {
  const long = new Date(overview.until) - new Date(overview.since) > 86400e3;
  return overview.buckets.map((bucket) => {
    const d = new Date(bucket.start);
    const time = d.toLocaleTimeString([], {hour: "2-digit", minute: "2-digit", hour12: false});
    return long ? `${d.getMonth() + 1}/${d.getDate()} ${time}` : time;
  });
}

// A line through the buckets that have a figure (points mark them; empty buckets are skipped over).
function line(label, data, color, extra = {}) {
  return {type: "line", label, data, borderColor: color, backgroundColor: color, pointRadius: 2, borderWidth: 2,
          spanGaps: true, ...extra};
}

function draw(id, config) {
  const canvas = document.getElementById(id);
  Chart.getChart(canvas)?.destroy();
  return new Chart(canvas, config);
}

function options(yTitle, extra = {}) {
  return {
    animation: false, responsive: true, maintainAspectRatio: false,
    interaction: {mode: "index", intersect: false},
    plugins: {legend: {position: "bottom", labels: {boxWidth: 12}},
              tooltip: {callbacks: {label: (item) => `${item.dataset.label}: ${Math.round(item.raw * 10) / 10}`}}},
    scales: {x: {ticks: {maxTicksLimit: 12, autoSkip: true}},
             y: {beginAtZero: true, title: {display: true, text: yTitle}}},
    ...extra,
  };
}

// Draws the three charts; returns them by name (the tests read their data back).
export function drawOverview(overview, stages) {
  const labels = bucketLabels(overview);
  const column = (key) => overview.buckets.map((bucket) => bucket[key]);
  const v2v = draw("chart-v2v", {
    type: "line",
    data: {labels, datasets: PERCENTILES.map((p) => line(p.label, column(p.key), p.color))},
    options: options("ms"),
  });
  const marks = draw("chart-stages", {
    type: "line",
    data: {labels, datasets: stages.slice(1).map((stage) => line(
      stage.markLabel, overview.buckets.map((bucket) => bucket.stages_p50[stage.mark] ?? null), stage.color))},
    options: options("ms after speech_end"),
  });
  const acceptance = draw("chart-acceptance", {
    type: "bar",
    data: {labels, datasets: [
      {type: "bar", label: "turns", data: column("turns"), backgroundColor: "#c9d3e6", yAxisID: "y"},
      line("acceptance rate (%)", overview.buckets.map((b) => (b.acceptance_rate === null ? null
        : b.acceptance_rate * 100)), "#16a085", {yAxisID: "rate"}),
    ]},
    options: options("turns", {scales: {
      x: {ticks: {maxTicksLimit: 12, autoSkip: true}},
      y: {beginAtZero: true, title: {display: true, text: "turns"}, ticks: {precision: 0}},
      rate: {position: "right", min: 0, max: 100, title: {display: true, text: "acceptance %"},
             grid: {drawOnChartArea: false}},
    }}),
  });
  return {v2v, marks, acceptance};
}
