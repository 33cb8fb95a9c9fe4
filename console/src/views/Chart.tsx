/** A small line chart of rates over time, drawn as SVG (no library, nothing inline to allow in the CSP). */

export interface Series {
  name: string;
  /** A class of style.css that colours the line and its legend. */
  className: string;
  values: number[];
}

const W = 640;
const H = 160;
const PAD = { left: 44, right: 8, top: 10, bottom: 20 };

/** A round upper bound for the axis: 1, 2, 5 × 10^n. */
function niceMax(v: number): number {
  if (v <= 1) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 5, 10].map((m) => m * p).find((m) => m >= v)!;
}

export function Chart(props: { series: Series[]; points: number; stepSeconds: number; unit: string }) {
  const max = niceMax(Math.max(0, ...props.series.flatMap((s) => s.values)));
  const x = (i: number, n: number) => PAD.left + ((W - PAD.left - PAD.right) * (props.points - n + i)) / Math.max(1, props.points - 1);
  const y = (v: number) => H - PAD.bottom - ((H - PAD.top - PAD.bottom) * v) / max;
  return (
    <figure class="chart">
      <svg viewBox={`0 0 ${W} ${H}`} role="img" aria-label={props.series.map((s) => s.name).join(" and ")}>
        {[0, 0.5, 1].map((f) => (
          <g key={f}>
            <line class="grid" x1={PAD.left} x2={W - PAD.right} y1={y(max * f)} y2={y(max * f)} />
            <text class="axis" x={PAD.left - 4} y={y(max * f) + 4} text-anchor="end">
              {Number.isInteger(max * f) ? max * f : (max * f).toFixed(1)}
            </text>
          </g>
        ))}
        <text class="axis" x={PAD.left} y={H - 4}>
          −{Math.round(((props.points - 1) * props.stepSeconds) / 60)} min
        </text>
        <text class="axis" x={W - PAD.right} y={H - 4} text-anchor="end">
          now
        </text>
        {props.series.map((s) => (
          <polyline key={s.name} class={`line ${s.className}`} points={s.values.map((v, i) => `${x(i, s.values.length).toFixed(1)},${y(v).toFixed(1)}`).join(" ")} />
        ))}
      </svg>
      <figcaption>
        {props.series.map((s) => (
          <span key={s.name} class={`legend ${s.className}`}>
            {s.name}: {(s.values[s.values.length - 1] ?? 0).toFixed(1)} {props.unit}
          </span>
        ))}
      </figcaption>
    </figure>
  );
}
