"""``render_prompt``: MemoryContext as one compact text block. The structured context stays the
contract; this is a convenience for hosts that want text."""
from __future__ import annotations

from memstream.schemas.read_models import MemoryContext


def episode_line(e) -> str:
    said = e.user_message + (f" / assistant: {e.assistant_message}" if e.assistant_message else "")
    return f"[{e.occurred_at:%Y-%m-%d}] user: {said}"


def edge_line(e) -> str:
    when = f"{e.valid_from:%Y-%m-%d} to {e.valid_to:%Y-%m-%d}" if e.valid_to else f"since {e.valid_from:%Y-%m-%d}"
    return f"{e.fact_sentence} ({when})"


def render_context(ctx: MemoryContext) -> str:
    """The memory part of a prompt (without the live message)."""
    out: list[str] = []
    if ctx.expert_identity:
        out.append(f"Persona: {ctx.expert_identity['name']}\n{ctx.expert_identity['instructions']}")
    if ctx.person_identity:
        out.append("About the user (from the host): " + "; ".join(f"{k}: {v}" for k, v in sorted(ctx.person_identity.items())))
    if ctx.profile:
        out.append("Profile: " + "; ".join(f"{k}: {_flat(v)}" for k, v in ctx.profile.items()))
    if ctx.due_reminders:
        out.append("Due reminders:\n" + "\n".join(f"- {r.text} (due {r.due_at:%Y-%m-%d %H:%M})" for r in ctx.due_reminders))
    if ctx.facts:
        out.append("Known facts:\n" + "\n".join(f"- {f.text}" for f in ctx.facts))
    if ctx.edges:
        out.append("Relationships:\n" + "\n".join(f"- {edge_line(e)}" for e in ctx.edges))
    if ctx.episodes:
        out.append("Relevant past conversation:\n" + "\n".join(f"- {episode_line(e)}" for e in ctx.episodes))
    if ctx.recent_turns:
        out.append("Recent turns:\n" + "\n".join(
            f"user: {t.user_message}\nassistant: {t.assistant_message}" for t in ctx.recent_turns))
    return "\n\n".join(out)


def render_prompt(ctx: MemoryContext, message: str) -> str:
    memory = render_context(ctx)
    return (f"<memory>\n{memory}\n</memory>\n\n" if memory else "") + f"User: {message}"


def _flat(value) -> str:
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if isinstance(value, dict):
        return ", ".join(f"{k} {_flat(v)}" for k, v in value.items())
    return str(value)
