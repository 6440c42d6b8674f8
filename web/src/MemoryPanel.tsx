// The user's long-term memories (`list_memories`) and deleting one (`delete_memory`).
import { useState } from "react";
import { type Memory, action } from "./api";

export function MemoryPanel({ who }: { who: { header: string | null; user_id: string | null } | null }) {
  const [memories, setMemories] = useState<Memory[] | null>(null);
  const [problem, setProblem] = useState<string | null>(null);
  const load = async () => {
    setProblem(null);
    try {
      setMemories((await action<{ memories: Memory[] }>("list_memories", { limit: 100 })).memories);
    } catch (e) {
      setProblem(e instanceof Error ? e.message : String(e));
    }
  };
  const remove = async (id: string) => {
    try {
      await action("delete_memory", { memory_id: id });
      setMemories((old) => (old ?? []).filter((m) => m.memory_id !== id));
    } catch (e) {
      setProblem(e instanceof Error ? e.message : String(e));
    }
  };
  return (
    <section className="memories" data-testid="memories">
      <div className="tree-bar">
        <strong>Memories</strong>
        <button type="button" onClick={load} data-testid="load-memories">
          {memories === null ? "Show" : "Refresh"}
        </button>
      </div>
      {who && !who.header && memories === null && <p className="hint">Memories belong to a user; without a user header there is none.</p>}
      {problem && <div className="error" role="alert">{problem}</div>}
      {memories && memories.length === 0 && <p className="hint">No memories.</p>}
      <ul>
        {(memories ?? []).map((m) => (
          <li key={String(m.memory_id)} data-testid="memory">
            {String(m.content ?? "")}{" "}
            <button type="button" onClick={() => remove(String(m.memory_id))}>
              Delete
            </button>
          </li>
        ))}
      </ul>
    </section>
  );
}
