// The shapes the daemon sends (crates/observe/src/snapshot.rs and
// crates/types/src/status.rs, serialised with serde).

export interface Offcode {
  name: string;
  implementation: string;
  pe: string;
  state: string;
  uptime_ms: number;
  handled: number;
  sent: number;
  dropped: number;
  turns: number;
  metrics: Record<string, number>;
  stop_reason: string | null;
  /** Restarts by the supervisor (its restart policy). */
  restarts?: number;
}

export interface Channel {
  name: string;
  transport: string;
  from: string;
  to: string[];
  probed: boolean;
  messages: number;
  dropped: number;
  backpressure: number;
  occupancy: number;
  capacity: number;
}

export interface App {
  id: number;
  name: string;
  state: string;
  uptime_ms: number;
  offcodes: Offcode[];
  channels?: Channel[];
}

export interface Pe {
  id: string;
  kind: string;
  cpu: number;
  allocated: number;
  busy?: number;
  detail: string;
}

/** One row of a capability panel (crates/observe/src/capability.rs). */
export interface CapabilityRow {
  key: string;
  value: number;
  /** "" (a count), "/s", "ms", "B/s" */
  unit: string;
  /** A word instead of a number (Orion's liveness). */
  text?: string;
}

export interface Capability {
  /** sikker | filewall | orion | tcps */
  kind: string;
  title: string;
  rows: CapabilityRow[];
}

export interface ServiceView {
  name: string;
  addr: string;
  up: boolean;
  error?: string;
  /** [series with labels, value] */
  samples: [string, number][];
  /** The panel of a service the daemon knows (Sikker, FileWall, Orion, TCPServers). */
  capability?: Capability;
}

export interface Snapshot {
  at_ms: number;
  apps: App[];
  pes: Pe[];
  services: ServiceView[];
}

export interface RuntimeEvent {
  at: number;
  app: string;
  offcode: string;
  event: string;
  [detail: string]: unknown;
}
