// The conversation, from assistant-ui's primitives: messages, the composer, edit composers, reload.
// The "< i/n >" switcher draws the server's `alternatives` (a message's edits or regenerations) and switches
// with `set_head`: the branches live on the server, so assistant-ui's own branch store is not used for them.
import { createContext, useContext, useState } from "react";
import {
  ActionBarPrimitive,
  ComposerPrimitive,
  MessagePrimitive,
  ThreadPrimitive,
  type ToolCallMessagePartProps,
  useAui,
  useAuiState,
} from "@assistant-ui/react";
import { action, type CheckpointState, type HistoryEntry, type Interrupt, type Memory } from "./api";
import type { MessageCustom } from "./store";

export type ChatControls = {
  switchTo: (checkpointId: string) => Promise<void>;
  saveOnly: (messageId: string, text: string) => Promise<void>;
  historyById: Map<string, HistoryEntry>;
  threadId: string | null;
  running: boolean;
};

export const ChatContext = createContext<ChatControls | null>(null);

function useControls(): ChatControls {
  const controls = useContext(ChatContext);
  if (!controls) throw new Error("ChatContext missing");
  return controls;
}

function useCustom(): MessageCustom | undefined {
  return useAuiState((s) => s.message.metadata?.custom as MessageCustom | undefined);
}

function BranchSwitch() {
  const custom = useCustom();
  const { switchTo, running } = useControls();
  const alternatives = custom?.alternatives;
  if (!alternatives || alternatives.count < 2 || custom?.pending) return null;
  const go = (i: number) => switchTo(alternatives.options[i].latest_checkpoint_id);
  const label = alternatives.kind === "edits" ? "version" : "answer";
  return (
    <span className="branch-switch" data-testid="branch-switch">
      <button
        type="button"
        aria-label={`Previous ${label}`}
        disabled={running || alternatives.index === 0}
        onClick={() => go(alternatives.index - 1)}
        title={alternatives.options[alternatives.index - 1]?.preview}
      >
        ‹
      </button>
      <span className="branch-count" data-testid="branch-count">
        {alternatives.index + 1}/{alternatives.count}
      </span>
      <button
        type="button"
        aria-label={`Next ${label}`}
        disabled={running || alternatives.index >= alternatives.count - 1}
        onClick={() => go(alternatives.index + 1)}
        title={alternatives.options[alternatives.index + 1]?.preview}
      >
        ›
      </button>
    </span>
  );
}

type Seen = { summary: string | null; memories: Map<string, string> };

/** What the model saw for this answer: the checkpoint's metadata (history entry) where the answer appeared;
 * opening it reads the summary's text (`get_checkpoint_state` of that checkpoint, no messages) when a summary
 * was used, and the recalled memories' texts (`list_memories`) when some were recalled. */
function ModelSaw() {
  const custom = useCustom();
  const { historyById, threadId } = useControls();
  const [open, setOpen] = useState(false);
  const [seen, setSeen] = useState<Seen | null>(null);
  const entry = custom?.checkpointId ? historyById.get(custom.checkpointId) : undefined;
  if (!entry || custom?.pending || entry.model_input_messages === undefined) return null;
  const before = Math.max(0, entry.message_count - 1);
  const trimmed = Math.max(0, before - (entry.model_input_messages ?? 0));
  const recalled = entry.recalled_memories ?? [];
  const lastItem = custom?.group.items[custom.group.items.length - 1]?.id;
  const toggle = async () => {
    setOpen(!open);
    if (open || seen !== null) return;
    const [state, listed] = await Promise.all([
      entry.summary_used && threadId
        ? action<CheckpointState>("get_checkpoint_state", {
            thread_id: threadId,
            checkpoint_id: entry.checkpoint_id,
            ...(lastItem ? { after_message_id: lastItem } : {}),
          }).catch(() => null)
        : null,
      recalled.length
        ? action<{ memories: Memory[] }>("list_memories", { limit: 100 }).catch(() => ({ memories: [] as Memory[] }))
        : { memories: [] as Memory[] },
    ]);
    const texts = new Map<string, string>();
    for (const memory of listed.memories) if (memory.memory_id) texts.set(memory.memory_id, String(memory.content ?? ""));
    setSeen({ summary: state?.context_summary ?? null, memories: texts });
  };
  return (
    <span className="model-saw">
      <button type="button" onClick={toggle} data-testid="model-saw-toggle">
        What the model saw
      </button>
      {open && (
        <dl data-testid="model-saw">
          <dt>Tokens in / out</dt>
          <dd>
            {entry.usage ? `${entry.usage.input_tokens} / ${entry.usage.output_tokens}` : "not reported by the model"}
          </dd>
          <dt>Messages sent</dt>
          <dd>
            {entry.model_input_messages} ({entry.model_input_tokens} tokens counted), {trimmed} trimmed
          </dd>
          <dt>Summary used</dt>
          <dd data-testid="model-saw-summary">
            {entry.summary_used ? (seen === null ? "yes" : seen.summary ?? "yes (its text is no longer stored)") : "no"}
          </dd>
          <dt>Memories recalled</dt>
          <dd>
            {recalled.length === 0 ? (
              "none"
            ) : (
              <ul data-testid="model-saw-memories">
                {recalled.map((id) => (
                  <li key={id} data-memory-id={id}>
                    {seen?.memories.get(id) ?? id}
                  </li>
                ))}
              </ul>
            )}
          </dd>
        </dl>
      )}
    </span>
  );
}

function ToolCall(props: ToolCallMessagePartProps) {
  return (
    <details className="tool-call" data-testid="tool-call">
      <summary>
        <code>
          {props.toolName}({props.argsText})
        </code>
        {props.result !== undefined ? <> → {String(props.result).slice(0, 80)}</> : " …"}
      </summary>
      <pre>{props.argsText}</pre>
      {props.result !== undefined && <pre>{String(props.result)}</pre>}
    </details>
  );
}

function TextPart({ text }: { text: string }) {
  return <p className="text-part">{text}</p>;
}

function UserMessage() {
  const id = useAuiState((s) => s.message.id);
  return (
    <MessagePrimitive.Root className="message user" data-testid="message" data-role="user" data-message-id={id}>
      <div className="bubble">
        <MessagePrimitive.Parts components={{ Text: TextPart }} />
      </div>
      <div className="message-bar">
        <ActionBarPrimitive.Root>
          <ActionBarPrimitive.Edit asChild>
            <button type="button" data-testid="edit">
              Edit
            </button>
          </ActionBarPrimitive.Edit>
        </ActionBarPrimitive.Root>
        <BranchSwitch />
      </div>
    </MessagePrimitive.Root>
  );
}

function AssistantMessage() {
  const id = useAuiState((s) => s.message.id);
  return (
    <MessagePrimitive.Root className="message assistant" data-testid="message" data-role="assistant" data-message-id={id}>
      <div className="bubble">
        <MessagePrimitive.Parts components={{ Text: TextPart, tools: { Fallback: ToolCall } }} />
      </div>
      <div className="message-bar">
        <ActionBarPrimitive.Root>
          <ActionBarPrimitive.Reload asChild>
            <button type="button" data-testid="regenerate">
              Regenerate
            </button>
          </ActionBarPrimitive.Reload>
        </ActionBarPrimitive.Root>
        <BranchSwitch />
        <ModelSaw />
      </div>
    </MessagePrimitive.Root>
  );
}

function EditComposer() {
  const aui = useAui();
  const { saveOnly } = useControls();
  const id = useAuiState((s) => s.message.id);
  return (
    <ComposerPrimitive.Root className="edit-composer" data-testid="edit-composer">
      <ComposerPrimitive.Input className="input" data-testid="edit-input" />
      <div className="edit-buttons">
        <ComposerPrimitive.Send asChild>
          <button type="button" data-testid="save-regenerate">
            Save and regenerate
          </button>
        </ComposerPrimitive.Send>
        <button
          type="button"
          data-testid="save-only"
          onClick={() => {
            const text = aui.composer().getState().text;
            aui.composer().cancel();
            void saveOnly(id, text);
          }}
        >
          Save only
        </button>
        <ComposerPrimitive.Cancel asChild>
          <button type="button">Cancel</button>
        </ComposerPrimitive.Cancel>
      </div>
    </ComposerPrimitive.Root>
  );
}

function choicesOf(value: unknown): string[] | null {
  if (value && typeof value === "object") {
    const v = value as Record<string, unknown>;
    for (const key of ["options", "choices"]) if (Array.isArray(v[key])) return (v[key] as unknown[]).map(String);
  }
  return null;
}

function questionOf(value: unknown): string {
  if (typeof value === "string") return value;
  if (value && typeof value === "object") {
    const v = value as Record<string, unknown>;
    for (const key of ["question", "message", "prompt"]) if (typeof v[key] === "string") return v[key] as string;
  }
  return JSON.stringify(value);
}

function InterruptCard({ interrupt, onResume }: { interrupt: Interrupt; onResume: (value: unknown) => void }) {
  const [text, setText] = useState("");
  const choices = choicesOf(interrupt.value);
  return (
    <div className="interrupt" data-testid="interrupt">
      <strong>The agent asks:</strong> {questionOf(interrupt.value)}
      <div className="interrupt-answers">
        {choices ? (
          choices.map((choice) => (
            <button type="button" key={choice} onClick={() => onResume(choice)}>
              {choice}
            </button>
          ))
        ) : (
          <form
            onSubmit={(e) => {
              e.preventDefault();
              onResume(text);
            }}
          >
            <input value={text} onChange={(e) => setText(e.target.value)} placeholder="Your answer" />
            <button type="submit">Answer</button>
          </form>
        )}
      </div>
    </div>
  );
}

export function Chat({ interrupts, onResume }: { interrupts: Interrupt[]; onResume: (value: unknown) => void }) {
  return (
    <ThreadPrimitive.Root className="thread">
      <ThreadPrimitive.Viewport className="viewport" data-testid="viewport">
        <ThreadPrimitive.Empty>
          <div className="empty">Start a conversation: every turn is a checkpoint you can come back to.</div>
        </ThreadPrimitive.Empty>
        <ThreadPrimitive.Messages components={{ UserMessage, AssistantMessage, EditComposer }} />
      </ThreadPrimitive.Viewport>
      {interrupts.map((interrupt) => (
        <InterruptCard key={interrupt.id} interrupt={interrupt} onResume={onResume} />
      ))}
      <ComposerPrimitive.Root className="composer">
        <ComposerPrimitive.Input className="input" placeholder="Message the agent" data-testid="composer-input" />
        <ThreadPrimitive.If running={false}>
          <ComposerPrimitive.Send asChild>
            <button type="submit" data-testid="send">
              Send
            </button>
          </ComposerPrimitive.Send>
        </ThreadPrimitive.If>
        <ThreadPrimitive.If running>
          <ComposerPrimitive.Cancel asChild>
            <button type="button" data-testid="stop">
              Stop
            </button>
          </ComposerPrimitive.Cancel>
        </ThreadPrimitive.If>
      </ComposerPrimitive.Root>
    </ThreadPrimitive.Root>
  );
}
