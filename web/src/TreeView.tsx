// The thread's checkpoint tree, laid out by dagre (the history's parent links; no geometry of our own).
// A click moves the head there (`set_head`); in compare mode two clicks compare (`compare_checkpoints`).
import { useEffect, useMemo, useRef, useState } from "react";
import { Graph, layout } from "@dagrejs/dagre";
import { type HistoryEntry, type Item, action, textOf } from "./api";

const NODE_W = 168;
const NODE_H = 30;

type Placed = { entry: HistoryEntry; x: number; y: number };
type Diff = { common_ancestor_checkpoint_id: string | null; only_a: Item[]; only_b: Item[] };

function label(entry: HistoryEntry): string {
  if (entry.source === "root") return "(start)";
  const text = entry.last_user_message || entry.last_message || "(no message)";
  // Branch records (issue 23): ★ the pinned checkpoint, ⇐ a merge_branch checkpoint.
  const records = entry as HistoryEntry & { merged_from?: unknown; pinned?: boolean };
  const mark = (records.pinned ? "★ " : "") + (records.merged_from ? "⇐ " : "") + (entry.source === "update" ? "✎ " : "");
  return mark + (text.length > 22 ? `${text.slice(0, 21)}…` : text);
}

function placed(history: HistoryEntry[]): { nodes: Placed[]; edges: { points: { x: number; y: number }[] }[]; width: number; height: number } {
  const g = new Graph();
  g.setGraph({ rankdir: "TB", nodesep: 14, ranksep: 18, marginx: 8, marginy: 8 });
  g.setDefaultEdgeLabel(() => ({}));
  const ids = new Set(history.map((e) => e.checkpoint_id));
  // Oldest first, so that dagre keeps siblings in the order they were written.
  const ordered = [...history].sort((a, b) => (a.checkpoint_id < b.checkpoint_id ? -1 : 1));
  for (const entry of ordered) g.setNode(entry.checkpoint_id, { width: NODE_W, height: NODE_H });
  for (const entry of ordered) {
    if (entry.parent_checkpoint_id && ids.has(entry.parent_checkpoint_id)) g.setEdge(entry.parent_checkpoint_id, entry.checkpoint_id);
  }
  layout(g);
  const byId = new Map(history.map((e) => [e.checkpoint_id, e]));
  const nodes = g.nodes().map((id) => {
    const n = g.node(id);
    return { entry: byId.get(id)!, x: n.x, y: n.y };
  });
  const edges = g.edges().map((e) => ({ points: g.edge(e).points ?? [] }));
  const graph = g.graph();
  const size = (n: number | undefined) => (n !== undefined && Number.isFinite(n) ? n : 0);
  return { nodes, edges, width: size(graph.width), height: size(graph.height) };
}

export function TreeView({ history, shown, onJump, threadId }: { history: HistoryEntry[]; shown: string | null; onJump: (id: string) => Promise<void>; threadId: string | null }) {
  const drawing = useMemo(() => placed(history), [history]);
  const [comparing, setComparing] = useState(false);
  const [picked, setPicked] = useState<string[]>([]);
  const [diff, setDiff] = useState<Diff | null>(null);
  const [problem, setProblem] = useState<string | null>(null);
  const box = useRef<HTMLDivElement>(null);
  const path = useMemo(() => {
    const byId = new Map(history.map((e) => [e.checkpoint_id, e]));
    const on = new Set<string>();
    for (let at = shown; at; at = byId.get(at)?.parent_checkpoint_id ?? null) on.add(at);
    return on;
  }, [history, shown]);

  useEffect(() => {
    const node = box.current?.querySelector<SVGGElement>(`[data-checkpoint-id="${shown}"]`);
    node?.scrollIntoView?.({ block: "center", inline: "center" });
  }, [shown, drawing]);

  useEffect(() => {
    setPicked([]);
    setDiff(null);
  }, [threadId]);

  const click = async (id: string) => {
    setProblem(null);
    if (!comparing) return onJump(id);
    const next = picked.length >= 2 ? [id] : [...picked, id];
    setPicked(next);
    setDiff(null);
    if (next.length === 2 && threadId) {
      try {
        setDiff(await action<Diff>("compare_checkpoints", { thread_id: threadId, checkpoint_a: next[0], checkpoint_b: next[1] }));
      } catch (e) {
        setProblem(e instanceof Error ? e.message : String(e));
      }
    }
  };

  if (!threadId) return null;
  return (
    <section className="tree" data-testid="tree">
      <div className="tree-bar">
        <strong>Tree</strong> <span data-testid="tree-count">{history.length} checkpoints</span>
        <label>
          <input type="checkbox" checked={comparing} onChange={(e) => { setComparing(e.target.checked); setPicked([]); setDiff(null); }} data-testid="compare-mode" />
          compare two
        </label>
      </div>
      <div className="tree-box" ref={box}>
        <svg width={drawing.width} height={drawing.height} data-testid="tree-svg">
          {drawing.edges.map((edge, i) => (
            <polyline key={i} points={edge.points.map((p) => `${p.x},${p.y}`).join(" ")} className="edge" />
          ))}
          {drawing.nodes.map(({ entry, x, y }) => {
            const classes = ["node"];
            if (entry.is_head) classes.push("head");
            if (entry.checkpoint_id === shown) classes.push("shown");
            if (path.has(entry.checkpoint_id)) classes.push("on-path");
            if (picked.includes(entry.checkpoint_id)) classes.push("picked");
            return (
              <g
                key={entry.checkpoint_id}
                className={classes.join(" ")}
                transform={`translate(${x - NODE_W / 2},${y - NODE_H / 2})`}
                onClick={() => click(entry.checkpoint_id)}
                data-testid="tree-node"
                data-checkpoint-id={entry.checkpoint_id}
                data-head={entry.is_head ? "true" : "false"}
              >
                <title>{`${entry.last_user_message}\n${entry.checkpoint_id}${entry.is_head ? " (head)" : ""}`}</title>
                <rect width={NODE_W} height={NODE_H} rx={6} />
                <text x={8} y={19}>
                  {entry.is_head ? "● " : ""}
                  {label(entry)}
                </text>
              </g>
            );
          })}
        </svg>
      </div>
      {problem && <div className="error">{problem}</div>}
      {diff && (
        <div className="diff" data-testid="diff">
          <div>
            Common ancestor: <code>{diff.common_ancestor_checkpoint_id?.slice(-8) ?? "none"}</code>
          </div>
          <div className="diff-cols">
            <div>
              <strong>Only in A</strong>
              <ul>{diff.only_a.map((m) => <li key={m.id}>{m.type === "message" ? textOf(m) : `${m.type} ${m.name ?? ""}`}</li>)}</ul>
            </div>
            <div>
              <strong>Only in B</strong>
              <ul>{diff.only_b.map((m) => <li key={m.id}>{m.type === "message" ? textOf(m) : `${m.type} ${m.name ?? ""}`}</li>)}</ul>
            </div>
          </div>
        </div>
      )}
    </section>
  );
}
