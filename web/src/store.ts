// Pure helpers over what the server says: no tree is rebuilt here beyond drawing the history's
// parent links (the server computes alternatives, heads and places).
import type { ThreadMessageLike } from "@assistant-ui/react";
import { type CheckpointState, type HistoryEntry, type Item, textOf } from "./api";

/** What a streaming turn (or merge: `merge_branch` streams like a turn) shows until its answer arrives. */
export type Running = {
  kind: "turn" | "edit" | "regenerate" | "resume" | "merge";
  /** Items of the shown state kept above the run (the rest is replaced by it). */
  keep: number;
  userText: string | null;
  items: Item[];
  text: string;
};

/** The shown list after a write's `state` (`include: ["state"]`): keep `message_offset` items, append the rest;
 * the kept items' current option now ends at the new checkpoint (docs: "What neither resends"). */
export function merged(old: CheckpointState | null, state: CheckpointState, wrote: boolean): CheckpointState {
  const kept = (old?.messages ?? []).slice(0, state.message_offset).map((item) => {
    if (!wrote || !item.alternatives) return item;
    const alternatives = item.alternatives;
    const options = alternatives.options.map((option, i) =>
      i === alternatives.index ? { ...option, latest_checkpoint_id: state.checkpoint_id } : option,
    );
    return { ...item, alternatives: { ...alternatives, options } };
  });
  return { ...state, message_offset: 0, messages: [...kept, ...state.messages] };
}

/** The history after a write: the new checkpoint's entry added (the state carries its fields), the head moved. */
export function withEntry(history: HistoryEntry[], state: CheckpointState): HistoryEntry[] {
  const head = state.head_checkpoint_id;
  const rest = history.filter((entry) => entry.checkpoint_id !== state.checkpoint_id);
  const { messages: _m, message_offset: _o, head_checkpoint_id: _h, interrupts: _i, thread_id: _t, ...entry } = state;
  return [{ ...entry, is_head: entry.checkpoint_id === head }, ...rest].map((e) => ({ ...e, is_head: e.checkpoint_id === head }));
}

export function withHead(history: HistoryEntry[], head: string): HistoryEntry[] {
  return history.map((entry) => ({ ...entry, is_head: entry.checkpoint_id === head }));
}

/** Items grouped as the chat shows them: a user message, or one answer (its tool calls, results and text). */
export type Group = { role: "user" | "assistant"; id: string; items: Item[]; index: number };

const isText = (item: Item | undefined) => item?.type === "message" && item.role !== "user";

/** An answer ends with its text: an assistant text message right after another (a merge's "Summary of another
 * branch ...", written after the answer it follows) starts its own bubble, so each answer keeps its own
 * checkpoint ("What the model saw", Regenerate). tests/helpers/web.py `api_view` groups the same way. */
export function groups(items: Item[]): Group[] {
  const out: Group[] = [];
  items.forEach((item, index) => {
    const user = item.type === "message" && item.role === "user";
    const last = out[out.length - 1];
    const answerDone = last && isText(item) && isText(last.items[last.items.length - 1]);
    if (user || !last || last.role === "user" || answerDone)
      out.push({ role: user ? "user" : "assistant", id: item.id, items: [item], index });
    else last.items.push(item);
  });
  return out;
}

export type MessageCustom = {
  group: Group;
  checkpointId: string | undefined;
  alternatives: Item["alternatives"];
  pending: boolean;
};

/** assistant-ui's message shape for one group. */
export function toThreadMessage(group: Group, pending = false): ThreadMessageLike {
  const custom: MessageCustom = {
    group,
    // An answer's last item: the checkpoint of its last model call (a resumed answer spans two checkpoints).
    checkpointId: group.items[group.items.length - 1].checkpoint_id,
    alternatives: group.items[group.items.length - 1].alternatives,
    pending,
  };
  if (group.role === "user") {
    return { role: "user", id: group.id, content: textOf(group.items[0]), metadata: { custom } };
  }
  const results = new Map(group.items.filter((i) => i.type === "function_call_output").map((i) => [i.call_id, i.output]));
  const content: any[] = [];
  for (const item of group.items) {
    if (item.type === "function_call") {
      let args: Record<string, unknown> = {};
      try {
        args = JSON.parse(item.arguments || "{}");
      } catch {
        args = { arguments: item.arguments };
      }
      content.push({
        type: "tool-call",
        toolCallId: item.call_id ?? item.id,
        toolName: item.name ?? "tool",
        args,
        argsText: item.arguments ?? "",
        result: results.get(item.call_id),
      });
    } else if (item.type === "message") {
      content.push({ type: "text", text: textOf(item) });
    }
  }
  return {
    role: "assistant",
    id: group.id,
    content,
    status: pending ? { type: "running" } : { type: "complete", reason: "stop" },
    metadata: { custom },
  };
}

/** The chat's messages: the shown state's, with a running turn's pending messages in place of what it replaces. */
export function threadMessages(shown: CheckpointState | null, running: Running | null): ThreadMessageLike[] {
  const items = shown?.messages ?? [];
  if (!running) return groups(items).map((g) => toThreadMessage(g));
  const kept = groups(items.slice(0, running.keep)).map((g) => toThreadMessage(g));
  const pending: ThreadMessageLike[] = [];
  if (running.userText !== null) {
    const user: Item = { type: "message", role: "user", id: "pending-user", content: running.userText };
    pending.push(toThreadMessage({ role: "user", id: user.id, items: [user], index: running.keep }, true));
  }
  const answer: Item[] = [...running.items.filter((i) => i.type !== "message")];
  answer.push({ type: "message", role: "assistant", id: "pending-answer", content: running.text });
  pending.push(toThreadMessage({ role: "assistant", id: "pending-answer", items: answer, index: running.keep + 1 }, true));
  return [...kept, ...pending];
}

/** The history without its archived branches, as the server's `list_branches` leaves them out: a checkpoint whose
 * entry says `archived` (`archive_branch` marks where a branch starts) and everything after it. The chain up to
 * `keep` (the shown checkpoint) stays, as the server keeps the chain it reads (`get_checkpoint_state`). */
export function withoutArchived(history: HistoryEntry[], keep: string | null | undefined): HistoryEntry[] {
  if (!history.some((e) => e.archived)) return history;
  const children = new Map<string, string[]>();
  for (const e of history) {
    if (!e.parent_checkpoint_id) continue;
    const siblings = children.get(e.parent_checkpoint_id);
    if (siblings) siblings.push(e.checkpoint_id);
    else children.set(e.parent_checkpoint_id, [e.checkpoint_id]);
  }
  const gone = new Set<string>();
  const stack = history.filter((e) => e.archived).map((e) => e.checkpoint_id);
  while (stack.length) {
    const id = stack.pop()!;
    if (gone.has(id)) continue;
    gone.add(id);
    stack.push(...(children.get(id) ?? []));
  }
  const byId = new Map(history.map((e) => [e.checkpoint_id, e]));
  for (let at = keep ?? null; at; at = byId.get(at)?.parent_checkpoint_id ?? null) gone.delete(at);
  return gone.size ? history.filter((e) => !gone.has(e.checkpoint_id)) : history;
}

/** Leaves of the history's tree, and how many of them are off the shown path (not at or after the shown checkpoint).
 * Give it the history `withoutArchived`, so that archived branches count as `list_branches` counts them: not at all. */
export function branchesOffPath(history: HistoryEntry[], shown: string | undefined): number {
  const parents = new Set(history.map((e) => e.parent_checkpoint_id).filter(Boolean));
  const leaves = history.filter((e) => !parents.has(e.checkpoint_id));
  if (!shown) return leaves.length;
  const byId = new Map(history.map((e) => [e.checkpoint_id, e]));
  const underShown = (id: string) => {
    for (let at: string | null | undefined = id; at; at = byId.get(at)?.parent_checkpoint_id) if (at === shown) return true;
    return false;
  };
  return leaves.filter((leaf) => !underShown(leaf.checkpoint_id)).length;
}
