// The page: threads on the left, the conversation (assistant-ui) in the middle, the tree and panels on the right.
// The server owns the tree: every control is one request, and its answer (`include: ["state"]`) is what is drawn.
import { useCallback, useEffect, useMemo, useRef, useState } from "react";
import { type AppendMessage, AssistantRuntimeProvider, useExternalStoreRuntime } from "@assistant-ui/react";
import {
  ApiError,
  type CheckpointState,
  type HistoryEntry,
  type Item,
  type Thread,
  action,
  identity,
  streamTurn,
  wholeHistory,
} from "./api";
import { Chat, type ChatControls, ChatContext } from "./Chat";
import { Sidebar } from "./Sidebar";
import { TreeView } from "./TreeView";
import { MemoryPanel } from "./MemoryPanel";
// Branch records, merge, search across branches, memory as of a checkpoint (issue 23's operations).
import { BranchActions } from "./BranchActions";
import { SearchPanel } from "./SearchPanel";
import { MemoryAsOf } from "./MemoryAsOf";
import { branchesOffPath, merged, type Running, threadMessages, withEntry, withHead, withoutArchived } from "./store";

function readUrl(): { thread: string | null; head: string | null } {
  const params = new URLSearchParams(window.location.search);
  return { thread: params.get("thread"), head: params.get("head") };
}

function writeUrl(thread: string | null, head: string | null, replace = false): void {
  const params = new URLSearchParams();
  if (thread) params.set("thread", thread);
  if (thread && head) params.set("head", head);
  const url = params.toString() ? `/?${params}` : "/";
  if (url === `${window.location.pathname}${window.location.search}`) return;
  if (replace) window.history.replaceState(null, "", url);
  else window.history.pushState(null, "", url);
}

function words(error: unknown): string {
  if (error instanceof ApiError) return error.message;
  return error instanceof Error ? error.message : String(error);
}

/** An id as the header shows it: a long one (a link may name any id of up to 256 characters) clipped as the
 * server clips ids in its messages (`agent.errors.shown_id`). */
function clippedId(id: string): string {
  return id.length > 64 ? `${id.slice(0, 40)}…` : id;
}

/** A 409: the server refused because another turn holds the thread (or the head moved under the request). */
function refusedAsBusy(error: unknown): boolean {
  return error instanceof ApiError && (error.status === 409 || error.code === "RESOURCE_CONFLICT" || error.code === "conflict");
}

function textOfAppend(message: AppendMessage): string {
  return message.content.map((part) => (part.type === "text" ? part.text : "")).join("");
}

export function App() {
  const [who, setWho] = useState<{ header: string | null; user_id: string | null } | null>(null);
  const [threads, setThreads] = useState<Thread[]>([]);
  const [threadId, setThreadId] = useState<string | null>(readUrl().thread);
  const [shown, setShownState] = useState<CheckpointState | null>(null);
  // What is shown, also as a ref: an answer is merged into what is shown when it arrives, not when it was asked.
  const shownRef = useRef<CheckpointState | null>(null);
  const setShown = useCallback((next: CheckpointState | null) => {
    shownRef.current = next;
    setShownState(next);
  }, []);
  // Every request whose answer replaces what is shown (open a thread, switch, a turn, save only) takes the next
  // number; its answer is drawn only while no newer one was asked. Answers can arrive out of order (two quick
  // clicks on the tree), and an older one drawn last would show a branch the head no longer is on.
  const asked = useRef(0);
  const ask = () => ++asked.current;
  const newest = (ticket: number) => ticket === asked.current;
  const [history, setHistory] = useState<HistoryEntry[]>([]);
  const [running, setRunning] = useState<Running | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [notice, setNotice] = useState<string | null>(null);
  const [loading, setLoading] = useState(false);
  // A link's head= that the thread does not hold: the error offers the thread's real head.
  const [missingHead, setMissingHead] = useState<string | null>(null);
  // A message typed while the agent's question (interrupt) waits: sent only once the user agrees to drop it.
  const [dropQuestion, setDropQuestion] = useState<string | null>(null);
  const abort = useRef<AbortController | null>(null);
  // A turn in flight, set before React draws it: a second click in the same instant (a double click on
  // Regenerate) is ignored rather than sent, as the server would refuse it ("busy") and the page would lose track.
  const busy = useRef(false);
  // Set below, once the runtime exists: puts text back in the composer after a refused turn.
  const restoreText = useRef<(text: string) => void>(() => {});

  const loadThreads = useCallback(async () => {
    try {
      const page = await action<{ threads: Thread[] }>("list_threads", { limit: 100 });
      setThreads(page.threads);
    } catch (e) {
      setError(words(e));
    }
  }, []);

  /** Open a thread at `head` (null: its head): the state and the whole history (for the tree), two requests. */
  const open = useCallback(async (thread: string | null, head: string | null, push: boolean) => {
    const ticket = ask();
    setError(null);
    setNotice(null);
    setMissingHead(null);
    setDropQuestion(null);
    setThreadId(thread);
    if (push) writeUrl(thread, head);
    if (!thread) {
      setShown(null);
      setHistory([]);
      return;
    }
    setLoading(true);
    try {
      const [state, entries] = await Promise.all([
        action<CheckpointState>("get_checkpoint_state", { thread_id: thread, ...(head ? { checkpoint_id: head } : {}) }),
        wholeHistory(thread),
      ]);
      if (!newest(ticket)) return;
      setShown(state);
      setHistory(entries);
      writeUrl(thread, state.checkpoint_id, true);
    } catch (e) {
      if (!newest(ticket)) return;
      setShown(null);
      setHistory([]);
      setError(words(e));
      if (head && e instanceof ApiError && e.status >= 400 && e.status < 500) setMissingHead(head);
    } finally {
      if (newest(ticket)) setLoading(false);
    }
  }, [setShown]);

  useEffect(() => {
    identity().then(setWho, (e) => setError(words(e)));
    loadThreads();
    const { thread, head } = readUrl();
    open(thread, head, false);
    const onPop = () => {
      const url = readUrl();
      open(url.thread, url.head, false);
    };
    window.addEventListener("popstate", onPop);
    return () => window.removeEventListener("popstate", onPop);
  }, [loadThreads, open]);

  /** Draw a write's answer: its `state` merged into what is shown, its checkpoint added to the tree. */
  const applyState = useCallback(
    (state: CheckpointState, wrote: boolean) => {
      const old = shownRef.current;
      setShown(merged(old && old.thread_id === state.thread_id ? old : null, state, wrote));
      setHistory((old) => (wrote ? withEntry(old, state) : withHead(old, state.head_checkpoint_id)));
      writeUrl(state.thread_id, state.checkpoint_id, false);
      setThreads((old) => {
        const known = old.find((t) => t.thread_id === state.thread_id);
        if (!known) return old;
        const updated = { ...known, checkpoint_id: state.head_checkpoint_id, updated_at: new Date().toISOString() };
        return wrote ? [updated, ...old.filter((t) => t !== known)] : old.map((t) => (t === known ? updated : t));
      });
    },
    [setShown],
  );

  /** After a refused or broken request (409 busy, a lost connection): read the thread's head and its history
   * again, so the page shows what the server holds (another tab's turn, a turn that landed) rather than what it
   * believed. The error stays shown; a failure to read (the server still away) leaves the page as it was.
   * `busy` (a 409: another turn holds the thread): the head is read again every second, for up to 30 s, until
   * it moves from the head shown before, so that the other turn's answer shows once it is saved. */
  const refresh = useCallback(
    async (thread: string, ticket: number, busy = false) => {
      const before = shownRef.current?.head_checkpoint_id;
      for (let attempt = 0; attempt < (busy ? 30 : 1); attempt++) {
        if (attempt) await new Promise((done) => setTimeout(done, 1000));
        if (!newest(ticket)) return;
        try {
          const [state, entries] = await Promise.all([
            action<CheckpointState>("get_checkpoint_state", { thread_id: thread }),
            wholeHistory(thread),
          ]);
          if (!newest(ticket)) return;
          setShown(state);
          setHistory(entries);
          writeUrl(thread, state.checkpoint_id, true);
          setThreads((old) => old.map((t) => (t.thread_id === thread ? { ...t, checkpoint_id: state.checkpoint_id } : t)));
          if (state.head_checkpoint_id !== before) return;
        } catch {
          return; // the server cannot answer: what is shown stays, with the error above it
        }
      }
    },
    [setShown],
  );

  /** The start of a write: the shown checkpoint when it is not the thread's head (a shared link, a read-only view). */
  const startFrom = useCallback((): Record<string, unknown> => {
    if (!shown) return {};
    return shown.checkpoint_id !== shown.head_checkpoint_id ? { checkpoint_id: shown.checkpoint_id } : {};
  }, [shown]);

  const runTurn = useCallback(
    async (input: string | null, inputs: Record<string, unknown>, run: Running): Promise<boolean> => {
      if (busy.current) return false;
      busy.current = true;
      setError(null);
      setNotice(null);
      setDropQuestion(null);
      const ticket = ask();
      const controller = new AbortController();
      abort.current = controller;
      setRunning(run);
      const creating = !threadId;
      try {
        const outputs = await streamTurn(
          input,
          { ...(threadId ? { thread_id: threadId } : {}), ...inputs },
          {
            onText: (delta) => setRunning((r) => (r ? { ...r, text: r.text + delta } : r)),
            onItem: (item: Item) =>
              setRunning((r) => (r && item.type !== "message" ? { ...r, items: [...r.items, item] } : r)),
          },
          controller.signal,
        );
        const state = outputs.state as CheckpointState;
        if (!newest(ticket)) return true; // something else was opened meanwhile: its answer is what is shown
        if (creating) {
          setThreadId(outputs.thread_id);
          setShown(null);
          setHistory([]);
          const [entries] = await Promise.all([wholeHistory(outputs.thread_id), loadThreads()]);
          if (!newest(ticket)) return true;
          setShown({ ...state, message_offset: 0 });
          setHistory(entries);
          writeUrl(outputs.thread_id, state.checkpoint_id, false);
        } else {
          applyState(state, true);
        }
        return true;
      } catch (e) {
        if (controller.signal.aborted) setNotice("Stopped: the turn was cancelled and nothing was saved.");
        else setError(words(e));
        // The typed text goes back in the composer: a refused turn need not be retyped.
        if (input !== null && run.kind === "turn") restoreText.current(input);
        if (!controller.signal.aborted && threadId && newest(ticket)) void refresh(threadId, ticket, refusedAsBusy(e));
        return false;
      } finally {
        abort.current = null;
        busy.current = false;
        setRunning(null);
      }
    },
    [threadId, applyState, loadThreads, setShown, refresh],
  );

  const indexOf = useCallback((id: string) => (shown?.messages ?? []).findIndex((item) => item.id === id), [shown]);

  const onNew = useCallback(
    async (message: AppendMessage) => {
      const text = textOfAppend(message);
      if (busy.current) {
        restoreText.current(text);
        return;
      }
      const keep = shown?.messages.length ?? 0;
      if (shown?.interrupts?.length) {
        // The API refuses a turn while the agent's question waits, so nobody answers it by accident: the page
        // asks the user first, and sends with `cancel_interrupts` only on their "yes" (dropQuestion's button).
        restoreText.current(text);
        setDropQuestion(text);
        return;
      }
      await runTurn(text, startFrom(), { kind: "turn", keep, userText: text, items: [], text: "" });
    },
    [shown, startFrom, runTurn],
  );

  /** "Send anyway": the message kept by `onNew`, sent with the agent's pending question dropped. */
  const sendDroppingQuestion = useCallback(async () => {
    const text = dropQuestion;
    if (text === null) return;
    setDropQuestion(null);
    restoreText.current("");
    const keep = shown?.messages.length ?? 0;
    await runTurn(text, { ...startFrom(), cancel_interrupts: true }, { kind: "turn", keep, userText: text, items: [], text: "" });
  }, [dropQuestion, shown, startFrom, runTurn]);

  const onEdit = useCallback(
    async (message: AppendMessage) => {
      const text = textOfAppend(message);
      const id = message.sourceId;
      if (!id) return onNew(message);
      if (busy.current) return;
      const at = indexOf(id);
      await runTurn(text, { ...startFrom(), edit_message_id: id }, { kind: "edit", keep: Math.max(at, 0), userText: text, items: [], text: "" });
    },
    [indexOf, onNew, runTurn, startFrom],
  );

  /** "Save only": the user message replaced in place (`update_checkpoint_state`), no model run. */
  const saveOnly = useCallback(
    async (messageId: string, text: string) => {
      if (!threadId || busy.current) return;
      setError(null);
      const ticket = ask();
      try {
        const outputs = await action<{ state: CheckpointState }>("update_checkpoint_state", {
          thread_id: threadId,
          ...startFrom(),
          edit_message_id: messageId,
          include: ["state"],
        }, [{ role: "user", content: text }]);
        if (newest(ticket)) applyState(outputs.state, true);
      } catch (e) {
        if (!newest(ticket)) return;
        setError(words(e));
        await refresh(threadId, ticket);
      }
    },
    [threadId, startFrom, applyState, refresh],
  );

  const onReload = useCallback(
    async (parentId: string | null) => {
      if (busy.current) return;
      const items = shown?.messages ?? [];
      const userAt = parentId ? indexOf(parentId) : -1;
      const answer = items[userAt + 1];
      if (!answer) return;
      await runTurn(null, { ...startFrom(), regenerate_message_id: answer.id }, {
        kind: "regenerate",
        keep: userAt + 1,
        userText: null,
        items: [],
        text: "",
      });
    },
    [shown, indexOf, runTurn, startFrom],
  );

  const onCancel = useCallback(async () => {
    abort.current?.abort();
  }, []);

  /** "< i/n >", a tree node: move the head there (`set_head`, nothing else written) and draw the answer's state.
   * The answer's `state` holds the messages from where the new head parts from the previous head
   * (`previous_checkpoint_id`). When the page showed another checkpoint (a link to an earlier one, the back
   * button), what it shows is not what that state continues: the whole state is read instead (a second request). */
  const switchTo = useCallback(
    async (checkpointId: string) => {
      if (!threadId || busy.current) return;
      setError(null);
      const ticket = ask();
      try {
        const outputs = await action<{ checkpoint_id: string; previous_checkpoint_id: string; state: CheckpointState }>("set_head", {
          thread_id: threadId,
          checkpoint_id: checkpointId,
          include: ["state"],
        });
        if (!newest(ticket)) return; // a newer click's answer is (or will be) drawn
        let state = outputs.state;
        const showing = shownRef.current;
        const continues =
          showing?.thread_id === threadId &&
          (showing.checkpoint_id === outputs.previous_checkpoint_id || showing.checkpoint_id === state.checkpoint_id);
        if (!continues && state.message_offset > 0) {
          state = await action<CheckpointState>("get_checkpoint_state", { thread_id: threadId, checkpoint_id: outputs.checkpoint_id });
          if (!newest(ticket)) return;
        }
        applyState(state, false);
      } catch (e) {
        if (!newest(ticket)) return;
        setError(words(e));
        await refresh(threadId, ticket);
      }
    },
    [threadId, applyState, refresh],
  );

  const resume = useCallback(
    async (value: unknown) => {
      await runTurn(null, { ...startFrom(), resume: value }, { kind: "resume", keep: shown?.messages.length ?? 0, userText: null, items: [], text: "" });
    },
    [runTurn, startFrom, shown],
  );

  const messages = useMemo(() => threadMessages(shown, running), [shown, running]);
  const runtime = useExternalStoreRuntime({
    messages,
    convertMessage: (m) => m,
    isRunning: running !== null,
    // While a turn runs assistant-ui hides Send and disables Regenerate; `busy` also refuses the same instant's
    // second click (a double click), and an edit saved meanwhile. Typing stays possible.
    onNew,
    onEdit,
    onReload,
    onCancel,
  });

  restoreText.current = (text: string) => runtime.thread.composer.setText(text);

  const historyById = useMemo(() => new Map(history.map((e) => [e.checkpoint_id, e])), [history]);
  const controls: ChatControls = { switchTo, saveOnly, historyById, threadId, running: running !== null };
  // Archived branches count as list_branches counts them: not at all (the shown checkpoint's own chain stays).
  const off = useMemo(
    () => branchesOffPath(withoutArchived(history, shown?.checkpoint_id), shown?.checkpoint_id),
    [history, shown?.checkpoint_id],
  );

  return (
    <div className="layout">
      <Sidebar
        threads={threads}
        current={threadId}
        who={who}
        onOpen={(id) => open(id, null, true)}
        onNew={() => open(null, null, true)}
        onRename={async (id, title) => {
          try {
            await action("update_thread", { thread_id: id, title });
            setThreads((old) => old.map((t) => (t.thread_id === id ? { ...t, title } : t)));
          } catch (e) {
            setError(words(e));
          }
        }}
        onDelete={async (id) => {
          try {
            await action("delete_thread", { thread_id: id });
            setThreads((old) => old.filter((t) => t.thread_id !== id));
            if (id === threadId) open(null, null, true);
          } catch (e) {
            setError(words(e));
          }
        }}
        onFork={async (id) => {
          try {
            const fork = await action<{ thread_id: string }>("fork_thread", {
              thread_id: id,
              ...(id === threadId && shown ? { checkpoint_id: shown.checkpoint_id } : {}),
            });
            await loadThreads();
            open(fork.thread_id, null, true);
          } catch (e) {
            setError(words(e));
          }
        }}
      />
      <main className="chat">
        <header className="chat-header">
          <span data-testid="thread-title">
            {threads.find((t) => t.thread_id === threadId)?.title ?? (threadId ? clippedId(threadId) : "New chat")}
          </span>
          {shown && (
            <span className="head-info">
              checkpoint <code data-testid="shown-checkpoint">{shown.checkpoint_id}</code>
              {shown.checkpoint_id === shown.head_checkpoint_id ? (
                <span className="badge" data-testid="is-head">head</span>
              ) : (
                <button type="button" onClick={() => switchTo(shown.checkpoint_id)}>
                  Make this the head
                </button>
              )}
              <span data-testid="branches-off-path" className="badge">
                {off} {off === 1 ? "branch leaves" : "branches leave"} this path
              </span>
            </span>
          )}
        </header>
        {error && (
          <div role="alert" className="error" data-testid="error">
            {error}
            {missingHead && threadId && (
              <>
                {" "}
                <button type="button" data-testid="open-real-head" onClick={() => open(threadId, null, true)}>
                  Open this thread at its head
                </button>
              </>
            )}
          </div>
        )}
        {dropQuestion !== null && (
          <div role="alert" className="notice" data-testid="drop-question">
            The agent is waiting for your answer to its question. Sending this message drops the question (the
            tool call it asked about is not run).{" "}
            <button type="button" data-testid="drop-question-send" onClick={sendDroppingQuestion}>
              Drop the question and send
            </button>{" "}
            <button type="button" onClick={() => setDropQuestion(null)}>
              Keep the question
            </button>
          </div>
        )}
        {notice && (
          <div role="status" className="notice" data-testid="notice">
            {notice}
          </div>
        )}
        {loading && <div className="notice">Loading…</div>}
        <AssistantRuntimeProvider runtime={runtime}>
          <ChatContext.Provider value={controls}>
            <Chat interrupts={running ? [] : shown?.interrupts ?? []} onResume={resume} />
          </ChatContext.Provider>
        </AssistantRuntimeProvider>
      </main>
      <aside className="side">
        <SearchPanel threads={threads} onOpen={(thread, checkpoint) => open(thread, checkpoint, true)} />
        <TreeView history={history} shown={shown?.checkpoint_id ?? null} onJump={switchTo} threadId={threadId} />
        <BranchActions
          threadId={threadId}
          shown={shown}
          version={`${history.length}:${shown?.head_checkpoint_id ?? ""}`}
          onOpen={switchTo}
          onChanged={(stay) => open(threadId, stay ? shown?.checkpoint_id ?? null : null, false)}
          onMerge={(inputs) =>
            runTurn(null, { action: "merge_branch", ...inputs }, { kind: "merge", keep: shown?.messages.length ?? 0, userText: null, items: [], text: "" })
          }
        />
        <MemoryPanel who={who} />
        <MemoryAsOf threadId={threadId} checkpointId={shown?.checkpoint_id ?? null} who={who} />
      </aside>
    </div>
  );
}
