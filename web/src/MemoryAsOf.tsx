// Memory that travels in time with the conversation: what the agent knew at the shown checkpoint
// (`list_memories` with `as_of_checkpoint`), and memories the model proposes from the shown branch
// (`extract_memories`): a dry run shows the proposals, "Write" asks again with `dry_run: false`, which writes
// them with the checkpoint as provenance (the model is asked twice: the written set is the answer's).
import { useEffect, useState } from "react";
import { type Memory, action } from "./api";

export type Proposal = {
  kind: string;
  content: string;
  memory_id: string | null;
  supersedes: string | null;
  superseded_content: string | null;
  version_id: string | null;
};

type Extraction = { checkpoint_id: string; dry_run: boolean; written: boolean; proposals: Proposal[] };

type Props = { threadId: string | null; checkpointId: string | null; who: { header: string | null } | null };

export function MemoryAsOf({ threadId, checkpointId, who }: Props) {
  const [asOf, setAsOf] = useState<{ at: string; memories: Memory[] } | null>(null);
  const [extraction, setExtraction] = useState<Extraction | null>(null);
  const [problem, setProblem] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);

  useEffect(() => {
    setAsOf(null);
    setExtraction(null);
    setProblem(null);
  }, [threadId, checkpointId]);

  const attempt = async (work: () => Promise<void>) => {
    setProblem(null);
    setBusy(true);
    try {
      await work();
    } catch (e) {
      setProblem(e instanceof Error ? e.message : String(e));
    } finally {
      setBusy(false);
    }
  };

  const showAsOf = () =>
    attempt(async () => {
      const listed = await action<{ memories: Memory[] }>("list_memories", { thread_id: threadId, as_of_checkpoint: checkpointId, limit: 100 });
      setAsOf({ at: checkpointId!, memories: listed.memories });
    });

  const extract = (dryRun: boolean) =>
    attempt(async () => {
      setExtraction(await action<Extraction>("extract_memories", { thread_id: threadId, checkpoint_id: checkpointId, dry_run: dryRun }));
      if (!dryRun) setAsOf(null);
    });

  if (!threadId || !checkpointId) return null;
  return (
    <section className="memories" data-testid="memory-as-of">
      <div className="tree-bar">
        <strong>At this checkpoint</strong>
        <button type="button" disabled={busy} onClick={showAsOf} data-testid="memories-as-of">
          What the agent knew
        </button>
        <button type="button" disabled={busy} onClick={() => extract(true)} data-testid="extract-memories">
          Extract memories
        </button>
      </div>
      {who && !who.header && <p className="hint">Memories belong to a user; without a user header there is none.</p>}
      {problem && (
        <div className="error" role="alert" data-testid="memory-as-of-error">
          {problem}
        </div>
      )}
      {asOf && (
        <>
          <p className="hint">As of checkpoint <code>{asOf.at.slice(-8)}</code>: {asOf.memories.length === 0 ? "no memories." : ""}</p>
          <ul>
            {asOf.memories.map((m) => (
              <li key={String(m.version_id ?? m.memory_id)} data-testid="memory-as-of-row" data-memory-id={String(m.memory_id)}>
                {String(m.content ?? "")}
                {m.supersedes ? <span className="badge">changed</span> : null}
              </li>
            ))}
          </ul>
        </>
      )}
      {extraction && (
        <div data-testid="extraction">
          <p className="hint">
            {extraction.dry_run
              ? extraction.proposals.length === 0
                ? "The model proposes no memory from this branch."
                : "The model proposes (nothing is written yet):"
              : extraction.written
                ? `Written: ${extraction.proposals.length} ${extraction.proposals.length === 1 ? "memory" : "memories"}, saved at this checkpoint.`
                : "Nothing to write."}
          </p>
          <ul>
            {extraction.proposals.map((p, i) => (
              <li key={i} data-testid="proposal" data-kind={p.kind}>
                <span className="badge">{p.kind}</span> {p.content}
                {p.superseded_content ? <span className="hint"> (instead of “{p.superseded_content}”)</span> : null}
              </li>
            ))}
          </ul>
          {extraction.dry_run && extraction.proposals.length > 0 && (
            <button type="button" disabled={busy} onClick={() => extract(false)} data-testid="extract-confirm">
              Write these memories
            </button>
          )}
        </div>
      )}
    </section>
  );
}
