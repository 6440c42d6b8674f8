// The page's only door to the server: the public HTTP API (POST /responses with custom_inputs
// actions, streamed turns). Every request the page makes goes through `action` or `streamTurn`.

export type Alternative = { checkpoint_id: string; latest_checkpoint_id: string; preview: string };
export type Alternatives = { kind: "edits" | "regenerations"; index: number; count: number; options: Alternative[] };

export type Item = {
  type: "message" | "function_call" | "function_call_output";
  id: string;
  role?: "user" | "assistant" | "system";
  content?: string | { type: string; text?: string }[];
  call_id?: string;
  name?: string;
  arguments?: string;
  output?: string;
  checkpoint_id?: string;
  branch_checkpoint_id?: string;
  alternatives?: Alternatives;
};

export type HistoryEntry = {
  checkpoint_id: string;
  parent_checkpoint_id: string | null;
  timestamp: string | null;
  message_count: number;
  last_message: string;
  last_user_message: string;
  source: string | null;
  is_head: boolean;
  model_input_messages?: number;
  model_input_tokens?: number;
  summary_used?: boolean;
  usage?: { input_tokens: number; output_tokens: number };
  recalled_memories?: string[];
  /** A branch record's fields (`label_branch`, `pin_branch`, `archive_branch`), on the checkpoints that have one. */
  label?: string | null;
  pinned?: boolean;
  archived?: boolean;
};

export type Interrupt = { id: string; value: unknown; node?: string };

export type CheckpointState = HistoryEntry & {
  thread_id: string;
  head_checkpoint_id: string;
  message_offset: number;
  messages: Item[];
  interrupts?: Interrupt[];
  context_summary?: string;
};

export type Thread = {
  thread_id: string;
  title: string | null;
  updated_at: string;
  checkpoint_id: string;
  message_count: number;
  forked_from: unknown;
};

export type Memory = { memory_id?: string; id?: string; content?: string; text?: string; [key: string]: unknown };

/** An error the server answered, in its own words (OpenAI's error body on /responses). */
export class ApiError extends Error {
  constructor(message: string, readonly status: number, readonly code: string | null) {
    super(message);
  }
}

async function errorOf(response: Response): Promise<ApiError> {
  let message = `${response.status} ${response.statusText}`;
  let code: string | null = null;
  try {
    const body = await response.json();
    message = body?.error?.message ?? body?.message ?? message;
    code = body?.error?.code ?? body?.error_code ?? null;
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(message, response.status, code);
}

/** One `custom_inputs.action` (`input`: the messages it applies, empty for most): its `custom_outputs`. */
export async function action<T = Record<string, any>>(
  name: string,
  inputs: Record<string, unknown> = {},
  input: unknown[] = [],
): Promise<T> {
  let response: Response;
  try {
    response = await fetch("/responses", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "agent", input, custom_inputs: { action: name, ...inputs } }),
    });
  } catch (error) {
    throw new ApiError(`The server cannot be reached (${String(error)}).`, 0, null);
  }
  if (!response.ok) throw await errorOf(response);
  const body = await response.json();
  return body.custom_outputs as T;
}

export type TurnCallbacks = {
  onText: (delta: string) => void;
  onItem: (item: Item) => void;
};

/** What the page says when a turn's stream breaks off before its last event. */
export const LOST =
  "The connection to the server was lost before the turn finished. A turn is saved only when it completes, so " +
  "this one was most likely not saved: reload to see what the server holds.";

/** A streamed turn: text deltas and finished items as they come; resolves with the last event's `custom_outputs`.
 * Aborting `signal` closes the stream: the server cancels the turn and writes nothing. */
export async function streamTurn(
  input: string | null,
  inputs: Record<string, unknown>,
  callbacks: TurnCallbacks,
  signal: AbortSignal,
): Promise<Record<string, any>> {
  const body = {
    model: "agent",
    stream: true,
    input: input === null ? [] : [{ role: "user", content: input }],
    custom_inputs: { include: ["state"], ...inputs },
  };
  let response: Response;
  try {
    response = await fetch("/responses", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
      signal,
    });
  } catch (error) {
    if (signal.aborted) throw error;
    throw new ApiError(`The server cannot be reached (${String(error)}).`, 0, null);
  }
  if (!response.ok) throw await errorOf(response);
  const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let outputs: Record<string, any> | null = null;
  for (;;) {
    let chunk: ReadableStreamReadResult<string>;
    try {
      chunk = await reader.read();
    } catch (error) {
      if (signal.aborted) throw error;
      // The server went away mid-turn (killed, restarted, the network): it saves a turn only when the turn
      // completes, so what the page streamed may not be what the server holds.
      throw new ApiError(LOST, 0, "connection_lost");
    }
    const { value, done } = chunk;
    if (done) break;
    buffer += value;
    let end: number;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data: "))
        .map((line) => line.slice(6))
        .join("\n");
      if (!data || data === "[DONE]") continue;
      const event = JSON.parse(data);
      if (event.type === "response.output_text.delta") callbacks.onText(event.delta ?? "");
      else if (event.type === "response.output_item.done" && event.item) callbacks.onItem(event.item as Item);
      else if (event.type === "response.completed") outputs = event.custom_outputs ?? event.response?.custom_outputs ?? {};
      else if (event.type === "error") throw new ApiError(event.message ?? event.error?.message ?? "The turn failed.", 500, event.code ?? null);
    }
  }
  if (outputs === null) throw new ApiError(LOST, 0, "connection_lost");
  return outputs;
}

/** Who the page acts as: the trusted user header's name and value, or none (one local user). */
export async function identity(): Promise<{ header: string | null; user_id: string | null }> {
  const response = await fetch("/web/identity");
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

/** The text of a message item. */
export function textOf(item: Item): string {
  if (typeof item.content === "string") return item.content;
  return (item.content ?? []).map((part) => part.text ?? "").join("");
}

/** A whole thread's checkpoints, newest first (every page of `get_checkpoint_history`). */
export async function wholeHistory(threadId: string): Promise<HistoryEntry[]> {
  const out: HistoryEntry[] = [];
  let before: string | undefined;
  for (;;) {
    const page = await action<{ history: HistoryEntry[] }>("get_checkpoint_history", {
      thread_id: threadId,
      limit: 1000,
      ...(before ? { before } : {}),
    });
    out.push(...page.history);
    if (page.history.length < 1000) return out;
    before = page.history[page.history.length - 1].checkpoint_id;
  }
}
