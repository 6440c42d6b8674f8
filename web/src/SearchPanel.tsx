// "Search all branches": `search_threads` over every message of every branch of the user's threads. A hit
// names the checkpoint where its message first appeared; opening it shows exactly that thread at that
// checkpoint (the URL's thread and head, as a shared link would), writing nothing.
import { useState } from "react";
import { type Thread, action } from "./api";

export type SearchHit = { thread_id: string; checkpoint_id: string; message_id: string; snippet: string };

type Props = {
  threads: Thread[];
  onOpen: (threadId: string, checkpointId: string) => void;
};

export function SearchPanel({ threads, onOpen }: Props) {
  const [query, setQuery] = useState("");
  const [hits, setHits] = useState<SearchHit[] | null>(null);
  const [problem, setProblem] = useState<string | null>(null);

  const search = async () => {
    setProblem(null);
    try {
      setHits((await action<{ hits: SearchHit[] }>("search_threads", { query, limit: 20 })).hits);
    } catch (e) {
      setHits(null);
      setProblem(e instanceof Error ? e.message : String(e));
    }
  };

  const titleOf = (threadId: string) => threads.find((t) => t.thread_id === threadId)?.title || threadId;
  return (
    <section className="search-all" data-testid="search-all">
      <form
        className="tree-bar"
        onSubmit={(e) => {
          e.preventDefault();
          search();
        }}
      >
        <input
          type="search"
          placeholder="Search all branches"
          aria-label="Search all branches"
          value={query}
          onChange={(e) => setQuery(e.target.value)}
          data-testid="search-all-input"
        />
        <button type="submit" data-testid="search-all-go">Search</button>
        {hits && (
          <button type="button" onClick={() => setHits(null)}>Clear</button>
        )}
      </form>
      {problem && (
        <div className="error" role="alert" data-testid="search-error">
          {problem}
        </div>
      )}
      {hits && hits.length === 0 && <p className="hint">No message on any branch holds every word.</p>}
      {hits && hits.length > 0 && (
        <ul className="search-hits">
          {hits.map((hit) => (
            <li key={`${hit.checkpoint_id}/${hit.message_id}`}>
              <button
                type="button"
                className="search-hit"
                onClick={() => onOpen(hit.thread_id, hit.checkpoint_id)}
                data-testid="search-hit"
                data-thread-id={hit.thread_id}
                data-checkpoint-id={hit.checkpoint_id}
                data-message-id={hit.message_id}
              >
                <span className="thread-title" data-testid="search-hit-title">{titleOf(hit.thread_id)}</span>
                <span className="search-snippet" data-testid="search-hit-snippet">{hit.snippet}</span>
              </button>
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}
