// The user's threads in catalogue order (`list_threads`: newest activity first). The title search asks the
// server (`list_threads` with `title_contains`), so it finds threads older than the 100 listed.
import { useEffect, useState } from "react";
import { action, type Thread } from "./api";

type Props = {
  threads: Thread[];
  current: string | null;
  who: { header: string | null; user_id: string | null } | null;
  onOpen: (id: string) => void;
  onNew: () => void;
  onRename: (id: string, title: string) => Promise<void>;
  onDelete: (id: string) => Promise<void>;
  onFork: (id: string) => Promise<void>;
};

function when(iso: string): string {
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? iso : date.toLocaleString();
}

function ThreadRow({ thread, current, onOpen, onRename, onDelete, onFork }: { thread: Thread; current: boolean } & Omit<Props, "threads" | "current" | "who" | "onNew">) {
  const [renaming, setRenaming] = useState(false);
  const [title, setTitle] = useState(thread.title ?? "");
  const [confirming, setConfirming] = useState(false);
  return (
    <li className={current ? "thread-row current" : "thread-row"} data-testid="thread-row" data-thread-id={thread.thread_id}>
      {renaming ? (
        <form
          onSubmit={async (e) => {
            e.preventDefault();
            await onRename(thread.thread_id, title);
            setRenaming(false);
          }}
        >
          <input aria-label="New title" value={title} onChange={(e) => setTitle(e.target.value)} autoFocus />
          <button type="submit">Save</button>
        </form>
      ) : (
        <button type="button" className="thread-open" onClick={() => onOpen(thread.thread_id)}>
          <span className="thread-title">{thread.title || "(untitled)"}</span>
          <span className="thread-time">{when(thread.updated_at)}</span>
        </button>
      )}
      <span className="thread-actions">
        <button type="button" onClick={() => setRenaming(true)} aria-label="Rename">
          Rename
        </button>
        <button type="button" onClick={() => onFork(thread.thread_id)} aria-label="Fork">
          Fork
        </button>
        {confirming ? (
          <span className="confirm">
            Delete for good?{" "}
            <button type="button" onClick={() => onDelete(thread.thread_id)}>
              Yes, delete
            </button>
            <button type="button" onClick={() => setConfirming(false)}>
              No
            </button>
          </span>
        ) : (
          <button type="button" onClick={() => setConfirming(true)} aria-label="Delete">
            Delete
          </button>
        )}
      </span>
    </li>
  );
}

export function Sidebar(props: Props) {
  const [query, setQuery] = useState("");
  const [found, setFound] = useState<Thread[] | null>(null);
  const needle = query.trim();
  useEffect(() => {
    if (!needle) {
      setFound(null);
      return;
    }
    let current = true;
    const timer = setTimeout(() => {
      action<{ threads: Thread[] }>("list_threads", { limit: 100, title_contains: needle }).then(
        (page) => current && setFound(page.threads),
        () => current && setFound([]),
      );
    }, 250);
    return () => {
      current = false;
      clearTimeout(timer);
    };
  }, [needle, props.threads]);
  // Until the server answers, the loaded threads filtered here; then the server's matches.
  const shown = !needle
    ? props.threads
    : (found ?? props.threads.filter((t) => (t.title ?? "").toLowerCase().includes(needle.toLowerCase())));
  return (
    <nav className="sidebar">
      <div className="identity" data-testid="identity">
        {props.who === null
          ? "…"
          : props.who.header
            ? `Signed in as ${props.who.user_id ?? "(no user: the proxy sent no " + props.who.header + ")"}`
            : "One local user (no user header is configured)"}
      </div>
      <button type="button" className="new-chat" onClick={props.onNew} data-testid="new-chat">
        New chat
      </button>
      <input
        type="search"
        placeholder="Search titles"
        value={query}
        onChange={(e) => setQuery(e.target.value)}
        data-testid="thread-search"
      />
      <ul className="threads">
        {shown.map((thread) => (
          <ThreadRow
            key={thread.thread_id}
            thread={thread}
            current={thread.thread_id === props.current}
            onOpen={props.onOpen}
            onRename={props.onRename}
            onDelete={props.onDelete}
            onFork={props.onFork}
          />
        ))}
      </ul>
    </nav>
  );
}
