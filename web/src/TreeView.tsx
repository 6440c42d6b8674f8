// The thread's checkpoint tree, laid out by dagre (the history's parent links; no geometry of our own).
// A click moves the head there (`set_head`); in compare mode two clicks compare (`compare_checkpoints`).
import { useEffect, useMemo, useRef, useState } from "react";
import { Graph, layout } from "@dagrejs/dagre";
import { type HistoryEntry, type Item, action, textOf } from "./api";
import { withoutArchived } from "./store";

const NODE_W = 168;
const NODE_H = 42;
/** Characters on one of a label's two lines: what fits in NODE_W at the tree's 11 px font. */
const LINE_CHARS = 26;
/** The server keeps a checkpoint's `last_user_message` to this many characters (`get_checkpoint_history`). */
const PREVIEW_CHARS = 100;

type Placed = { entry: HistoryEntry; x: number; y: number; lines: string[] };
type Diff = { common_ancestor_checkpoint_id: string | null; only_a: Item[]; only_b: Item[] };

function textOfEntry(entry: HistoryEntry): string {
  return entry.last_user_message || entry.last_message || "(no message)";
}

function sharedStart(a: string, b: string): number {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
}

/** `text` in at most `lines` lines of `LINE_CHARS`, broken between words, the last cut with "…". */
function wrapped(text: string, lines: number): string[] {
  const out: string[] = [];
  let rest = text.trim();
  while (rest && out.length < lines) {
    if (rest.length <= LINE_CHARS) {
      out.push(rest);
      rest = "";
      break;
    }
    const space = rest.lastIndexOf(" ", LINE_CHARS);
    const cut = space > LINE_CHARS / 2 ? space : LINE_CHARS;
    out.push(rest.slice(0, cut));
    rest = rest.slice(cut).trimStart();
  }
  if (rest && out.length) out[out.length - 1] = `${out[out.length - 1].slice(0, LINE_CHARS - 1).trimEnd()}…`;
  return out;
}

/** A node's two lines: the user message that led to it, from a little before where it parts from its siblings'
 * when they share a long beginning (an edit often changes a message's end). A regeneration has its sibling's
 * user message: its second line is the start of its answer instead. Marks: ★ the pinned checkpoint, ⇐ a
 * merge_branch checkpoint, ✎ a state update (branch records: `get_checkpoint_history`). */
function labelLines(entry: HistoryEntry, siblings: HistoryEntry[]): string[] {
  const head = entry.is_head ? "● " : "";
  if (entry.source === "root") return [`${head}(start)`];
  const records = entry as HistoryEntry & { merged_from?: unknown };
  const mark = head + (records.pinned ? "★ " : "") + (records.merged_from ? "⇐ " : "") + (entry.source === "update" ? "✎ " : "");
  const text = textOfEntry(entry);
  const others = siblings.filter((s) => s !== entry);
  const same = others.filter((s) => entry.last_user_message && s.last_user_message === entry.last_user_message);
  if (same.length) {
    const answer = entry.last_message || "(no answer)";
    const answerLine = fromWhereItParts(answer, same.map((s) => s.last_message || ""), LINE_CHARS - 2);
    return [wrapped(mark + text, 1)[0], ...wrapped(`↳ ${answerLine}`, 1)];
  }
  return wrapped(mark + fromWhereItParts(text, others.map(textOfEntry), 2 * LINE_CHARS - mark.length), 2);
}

/** `text`, or when it shares more than `room` less a few words' worth of its start with one of `others`:
 * "…" and `text` from the word before where the two part, so that what tells them apart is in view. */
function fromWhereItParts(text: string, others: string[], room: number): string {
  const differs = Math.max(0, ...others.map((other) => sharedStart(text, other)));
  if (differs <= room - 12) return text;
  const from = text.lastIndexOf(" ", differs - 10);
  return `…${text.slice(from > 0 ? from + 1 : Math.max(0, differs - 10))}`;
}

/** The tooltip: the user message as the history holds it (its first 100 characters), the id, the head. */
function tooltip(entry: HistoryEntry): string {
  const text = textOfEntry(entry);
  const clipped = text.length >= PREVIEW_CHARS ? "…" : "";
  return `${text}${clipped}\n${entry.checkpoint_id}${entry.is_head ? " (head)" : ""}${entry.archived ? " (archived)" : ""}`;
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
  const children = new Map<string | null, HistoryEntry[]>();
  for (const entry of ordered) {
    const parent = entry.parent_checkpoint_id && ids.has(entry.parent_checkpoint_id) ? entry.parent_checkpoint_id : null;
    const siblings = children.get(parent);
    if (siblings) siblings.push(entry);
    else children.set(parent, [entry]);
  }
  const nodes = g.nodes().map((id) => {
    const n = g.node(id);
    const entry = byId.get(id)!;
    const parent = entry.parent_checkpoint_id && ids.has(entry.parent_checkpoint_id) ? entry.parent_checkpoint_id : null;
    return { entry, x: n.x, y: n.y, lines: labelLines(entry, children.get(parent) ?? []) };
  });
  const edges = g.edges().map((e) => ({ points: g.edge(e).points ?? [] }));
  const graph = g.graph();
  const size = (n: number | undefined) => (n !== undefined && Number.isFinite(n) ? n : 0);
  return { nodes, edges, width: size(graph.width), height: size(graph.height) };
}

export function TreeView({ history, shown, onJump, threadId }: { history: HistoryEntry[]; shown: string | null; onJump: (id: string) => Promise<void>; threadId: string | null }) {
  const [showArchived, setShowArchived] = useState(false);
  // Archived branches are hidden, as in the branch list, unless asked for; the shown checkpoint's chain stays.
  const visible = useMemo(() => withoutArchived(history, shown), [history, shown]);
  const drawn = showArchived ? history : visible;
  const archived = history.length - visible.length;
  const visibleIds = useMemo(() => (visible === history ? null : new Set(visible.map((e) => e.checkpoint_id))), [history, visible]);
  const drawing = useMemo(() => placed(drawn), [drawn]);
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
        <strong>Tree</strong> <span data-testid="tree-count">{drawn.length} checkpoints</span>
        {archived > 0 && (
          <label title="Branches archived with Archive (under the tree) are hidden from the tree and the branch counts">
            <input type="checkbox" checked={showArchived} onChange={(e) => setShowArchived(e.target.checked)} data-testid="tree-show-archived" />
            {archived} archived
          </label>
        )}
        <label>
          <input type="checkbox" checked={comparing} onChange={(e) => { setComparing(e.target.checked); setPicked([]); setDiff(null); }} data-testid="compare-mode" />
          compare two
        </label>
      </div>
      <div className="tree-box" ref={box}>
        <svg width={drawing.width} height={drawing.height} data-testid="tree-svg">
          <defs>
            {/* Each node's text stays in its box (in each node's own coordinates) even where a line runs long. */}
            <clipPath id="tree-node-text" clipPathUnits="userSpaceOnUse">
              <rect x={2} y={0} width={NODE_W - 6} height={NODE_H} />
            </clipPath>
          </defs>
          {drawing.edges.map((edge, i) => (
            <polyline key={i} points={edge.points.map((p) => `${p.x},${p.y}`).join(" ")} className="edge" />
          ))}
          {drawing.nodes.map(({ entry, x, y, lines }) => {
            const classes = ["node"];
            if (visibleIds && !visibleIds.has(entry.checkpoint_id)) classes.push("archived");
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
                <title>{tooltip(entry)}</title>
                <rect width={NODE_W} height={NODE_H} rx={6} />
                <text x={8} y={lines.length > 1 ? 17 : 25} clipPath="url(#tree-node-text)">
                  {/* One line as plain text: a tspan per node costs the first render of a long thread. */}
                  {lines.length === 1
                    ? lines[0]
                    : lines.map((line, i) => (
                        <tspan key={i} x={8} dy={i ? 14 : 0}>
                          {line}
                        </tspan>
                      ))}
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
