// The thread's branches as the server lists them (`list_branches`: the pinned one first, archived ones only
// with "show archived"), and what can be done to one: open, label, pin, archive, delete, merge into the shown
// checkpoint. Each is one action request; the page then redraws from what the server says (no branch record
// is kept here). A merge runs as a streamed turn (`onMerge`: its summary shows in the chat as the model writes
// it, as a turn's answer does). A merge's provenance (`merged_from` of the shown checkpoint) is shown under the list.
import { useCallback, useEffect, useState } from "react";
import { type CheckpointState, type Item, action, textOf } from "./api";

export type Branch = {
  checkpoint_id: string;
  last_user_message: string;
  last_message: string;
  is_head: boolean;
  fork_checkpoint_id: string | null;
  label: string | null;
  pinned: boolean;
  archived: boolean;
};

export type MergedFrom = {
  thread_id: string;
  checkpoint_id: string;
  common_ancestor_checkpoint_id: string | null;
  mode: "summary" | "messages";
  message_ids: string[] | null;
};

type Props = {
  threadId: string | null;
  shown: CheckpointState | null;
  /** Changes when the tree changes (a new checkpoint, a moved head): the list is read again. */
  version: string;
  onOpen: (checkpointId: string) => Promise<void>;
  /** The tree changed (archive, delete): read the thread again; `stay` false when the shown checkpoint is gone. */
  onChanged: (stay: boolean) => Promise<void>;
  /** Run `merge_branch` with these inputs (not `thread_id`) as a streamed turn: the chat shows its summary as it
   * comes, then the new checkpoint, now the head. Resolves with whether it was saved (the page shows why not). */
  onMerge: (inputs: Record<string, unknown>) => Promise<boolean>;
};

function short(id: string): string {
  return id.slice(-8);
}

function words(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

export function BranchActions({ threadId, shown, version, onOpen, onChanged, onMerge }: Props) {
  const [branches, setBranches] = useState<Branch[]>([]);
  const [showArchived, setShowArchived] = useState(false);
  const [problem, setProblem] = useState<string | null>(null);
  const [labelling, setLabelling] = useState<{ id: string; text: string } | null>(null);
  const [deleting, setDeleting] = useState<string | null>(null);
  const [merging, setMerging] = useState<{ source: string; mode: "summary" | "messages"; items: Item[]; chosen: string[] } | null>(null);
  const [busy, setBusy] = useState(false);

  const load = useCallback(async () => {
    if (!threadId) return setBranches([]);
    try {
      const listed = await action<{ branches: Branch[] }>("list_branches", { thread_id: threadId, include_archived: showArchived });
      setBranches(listed.branches);
    } catch (e) {
      setProblem(words(e));
    }
  }, [threadId, showArchived]);

  useEffect(() => {
    load();
  }, [load, version]);

  useEffect(() => {
    setProblem(null);
    setLabelling(null);
    setDeleting(null);
    setMerging(null);
  }, [threadId]);

  /** One branch action; `tree`: whether the tree changed (read the thread again), `stay`: the shown checkpoint remains. */
  const run = async (name: string, inputs: Record<string, unknown>, tree: boolean, stay = true) => {
    if (!threadId) return;
    setProblem(null);
    setBusy(true);
    try {
      await action(name, { thread_id: threadId, ...inputs });
      await load();
      if (tree) await onChanged(stay);
    } catch (e) {
      setProblem(words(e));
    } finally {
      setBusy(false);
    }
  };

  const startMerge = async (source: string, mode: "summary" | "messages") => {
    if (!threadId || !shown) return;
    setProblem(null);
    if (mode === "summary") return setMerging({ source, mode, items: [], chosen: [] });
    setMerging({ source, mode, items: [], chosen: [] });
    try {
      // What the source added since the common ancestor: its messages to choose from.
      const diff = await action<{ only_a: Item[] }>("compare_checkpoints", {
        thread_id: threadId,
        checkpoint_a: source,
        checkpoint_b: shown.checkpoint_id,
      });
      const items = diff.only_a.filter((item) => item.type === "message" && textOf(item).trim());
      setMerging({ source, mode, items, chosen: items.map((item) => item.id) });
    } catch (e) {
      setProblem(words(e));
    }
  };

  const merge = async () => {
    if (!threadId || !shown || !merging) return;
    setProblem(null);
    setBusy(true);
    try {
      const saved = await onMerge({
        source_checkpoint_id: merging.source,
        checkpoint_id: shown.checkpoint_id, // the target (`target_checkpoint_id` in Python)
        mode: merging.mode,
        ...(merging.mode === "messages" ? { message_ids: merging.chosen } : {}),
      });
      if (saved) setMerging(null);
    } finally {
      setBusy(false);
    }
  };

  if (!threadId) return null;
  const mergedFrom = (shown as (CheckpointState & { merged_from?: MergedFrom }) | null)?.merged_from;
  return (
    <section className="branches" data-testid="branches">
      <div className="tree-bar">
        <strong>Branches</strong> <span>{branches.length}</span>
        <label>
          <input type="checkbox" checked={showArchived} onChange={(e) => setShowArchived(e.target.checked)} data-testid="show-archived" />
          show archived
        </label>
      </div>
      {problem && (
        <div className="error" role="alert" data-testid="branch-error">
          {problem}
        </div>
      )}
      <ul className="branch-list">
        {branches.map((b) => (
          <li
            key={b.checkpoint_id}
            className={`branch-row${b.is_head ? " head" : ""}${b.archived ? " archived" : ""}`}
            data-testid="branch-row"
            data-checkpoint-id={b.checkpoint_id}
            data-pinned={b.pinned ? "true" : "false"}
            data-archived={b.archived ? "true" : "false"}
          >
            <div className="branch-name" title={b.checkpoint_id}>
              {b.pinned && <span data-testid="branch-pinned" title="the thread's main branch">★ </span>}
              <span data-testid="branch-label">{b.label ?? ""}</span>
              {b.label ? " · " : ""}
              <span className="branch-text">{b.last_user_message || b.last_message || "(start)"}</span>
              {b.is_head && <span className="badge">head</span>}
              {b.archived && <span className="badge">archived</span>}
            </div>
            {labelling?.id === b.checkpoint_id ? (
              <form
                className="branch-form"
                onSubmit={(e) => {
                  e.preventDefault();
                  const text = labelling.text.trim();
                  setLabelling(null);
                  run("label_branch", { checkpoint_id: b.checkpoint_id, label: text || null }, false);
                }}
              >
                <input aria-label="Branch label" value={labelling.text} onChange={(e) => setLabelling({ id: b.checkpoint_id, text: e.target.value })} autoFocus />
                <button type="submit">Save label</button>
                <button type="button" onClick={() => setLabelling(null)}>Cancel</button>
              </form>
            ) : deleting === b.checkpoint_id ? (
              <span className="confirm">
                Delete this branch's own checkpoints?{" "}
                <button type="button" onClick={() => { setDeleting(null); run("delete_branch", { checkpoint_id: b.checkpoint_id }, true, b.checkpoint_id !== shown?.checkpoint_id); }}>
                  Yes, delete
                </button>
                <button type="button" onClick={() => setDeleting(null)}>No</button>
              </span>
            ) : (
              <div className="thread-actions">
                <button type="button" disabled={busy} onClick={() => onOpen(b.checkpoint_id)}>Open</button>
                <button type="button" disabled={busy} onClick={() => setLabelling({ id: b.checkpoint_id, text: b.label ?? "" })}>Label</button>
                <button type="button" disabled={busy} onClick={() => run("pin_branch", { checkpoint_id: b.checkpoint_id, pinned: !b.pinned }, false)}>
                  {b.pinned ? "Unpin" : "Pin"}
                </button>
                {b.archived ? (
                  <button type="button" disabled={busy} onClick={() => run("unarchive_branch", { checkpoint_id: b.checkpoint_id }, true)}>Unarchive</button>
                ) : (
                  <button type="button" disabled={busy} onClick={() => run("archive_branch", { checkpoint_id: b.checkpoint_id }, true)}>Archive</button>
                )}
                <button type="button" disabled={busy} onClick={() => setDeleting(b.checkpoint_id)}>Delete</button>
                {shown && b.checkpoint_id !== shown.checkpoint_id && (
                  <button type="button" disabled={busy} onClick={() => startMerge(b.checkpoint_id, "summary")}>Merge into shown</button>
                )}
              </div>
            )}
          </li>
        ))}
      </ul>
      {merging && shown && (
        <div className="merge-form" data-testid="merge-form">
          <div>
            Merge <code>{short(merging.source)}</code> into <code>{short(shown.checkpoint_id)}</code> as{" "}
            <label>
              <input type="radio" name="merge-mode" checked={merging.mode === "summary"} onChange={() => startMerge(merging.source, "summary")} />
              a summary
            </label>{" "}
            <label>
              <input type="radio" name="merge-mode" checked={merging.mode === "messages"} onChange={() => startMerge(merging.source, "messages")} data-testid="merge-mode-messages" />
              messages
            </label>
          </div>
          {merging.mode === "messages" && (
            <ul>
              {merging.items.map((item) => (
                <li key={item.id}>
                  <label>
                    <input
                      type="checkbox"
                      data-testid="merge-message"
                      data-message-id={item.id}
                      checked={merging.chosen.includes(item.id)}
                      onChange={(e) =>
                        setMerging({ ...merging, chosen: e.target.checked ? [...merging.chosen, item.id] : merging.chosen.filter((id) => id !== item.id) })
                      }
                    />
                    {item.role}: {textOf(item)}
                  </label>
                </li>
              ))}
            </ul>
          )}
          <button type="button" disabled={busy || (merging.mode === "messages" && merging.chosen.length === 0)} onClick={merge} data-testid="merge-confirm">
            Merge
          </button>{" "}
          <button type="button" onClick={() => setMerging(null)}>Cancel</button>
        </div>
      )}
      {mergedFrom && (
        <div className="hint" data-testid="merged-from">
          This checkpoint merged {mergedFrom.mode === "summary" ? "a summary of" : `${mergedFrom.message_ids?.length ?? 0} messages of`} the branch
          at <code data-testid="merged-from-checkpoint">{mergedFrom.checkpoint_id}</code>
          {mergedFrom.thread_id !== shown?.thread_id ? ` of thread ${mergedFrom.thread_id}` : ""} (common ancestor{" "}
          <code>{mergedFrom.common_ancestor_checkpoint_id ? short(mergedFrom.common_ancestor_checkpoint_id) : "none"}</code>).{" "}
          <button type="button" onClick={() => onOpen(mergedFrom.checkpoint_id)}>Open the source</button>
        </div>
      )}
    </section>
  );
}
