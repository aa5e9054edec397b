"""tether: a harness that lets LLM agents survive being interrupted.

The agent proposes the next action; tether owns everything around it: a
prioritised event inbox, versioned snapshots, a resume point before every
tool call, idempotency keys, bounded recovery and a needs-a-person path.
"""

from tether.agent import Agent, CutOff, Fallback, TaskView
from tether.errors import (
    ConfigurationError,
    CorruptSnapshot,
    CorruptStore,
    IllegalTransition,
    InboxFull,
    InDoubtCall,
    InvalidInput,
    LeaseLost,
    NeedsPerson,
    NotRetryable,
    OutcomeUnknown,
    RateLimited,
    ReservedEventType,
    SnapshotTooNew,
    StoreError,
    StoreUnavailable,
    TaskClosed,
    TaskExists,
    TaskNotFound,
    TetherError,
    ToolTimeout,
    UnknownAgent,
    UnknownEventType,
    VersionNotFound,
)
from tether.harness import Harness, TaskInfo
from tether.model import (
    Action,
    CancelSubtask,
    EmitReceipt,
    Event,
    Fail,
    Finish,
    Priority,
    Replan,
    Reply,
    Snapshot,
    Spawn,
    Status,
    ToolCall,
    Wait,
)
from tether.protocol import InterruptionProtocol, Rule
from tether.settings import Settings
from tether.throttling import Limit
from tether.tools import RetryPolicy, Tool, ToolContext, ToolPolicy, current_call

__version__ = "0.1.0"

__all__ = [
    "Action",
    "Agent",
    "CancelSubtask",
    "ConfigurationError",
    "CorruptSnapshot",
    "CorruptStore",
    "CutOff",
    "EmitReceipt",
    "Event",
    "Fail",
    "Fallback",
    "Finish",
    "Harness",
    "IllegalTransition",
    "InDoubtCall",
    "InboxFull",
    "InterruptionProtocol",
    "InvalidInput",
    "LeaseLost",
    "Limit",
    "NeedsPerson",
    "NotRetryable",
    "OutcomeUnknown",
    "Priority",
    "RateLimited",
    "Replan",
    "Reply",
    "ReservedEventType",
    "RetryPolicy",
    "Rule",
    "Settings",
    "Snapshot",
    "SnapshotTooNew",
    "Spawn",
    "Status",
    "StoreError",
    "StoreUnavailable",
    "TaskClosed",
    "TaskExists",
    "TaskInfo",
    "TaskNotFound",
    "TaskView",
    "TetherError",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolPolicy",
    "ToolTimeout",
    "UnknownAgent",
    "UnknownEventType",
    "VersionNotFound",
    "Wait",
    "__version__",
    "current_call",
]
