"""The grammar IR that every front end (regex, JSON schema, lark) compiles to.

A grammar is a set of named rules; each rule body is an expression over
literal text, regex terminals, references to other rules (recursion allowed),
sequences, choices and bounded or unbounded repetition.  Terminals are
matched whole against decoded text (str); the runtime turns them into byte
automata, so front ends never think about UTF-8 or tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, Union

if TYPE_CHECKING:
    from .fsm import DFA

# The nodes are values (hashed, shared, memoised by equality) and never changed, but not frozen dataclasses: those
# set each field through object.__setattr__, which doubled the cost of building a node, and a compile builds
# thousands.


@dataclass(slots=True, unsafe_hash=True)
class Lit:
    """Exact text."""

    text: str


class Language(Protocol):
    """A set of strings given by its own byte automaton, for sets no short regex writes (the multiples of 7);
    hashable, so equal terminals still share one automaton."""

    def dfa(self) -> "DFA": ...

    def intersect(self, dfa: "DFA", max_states: int) -> "DFA":
        """The minimal DFA of `dfa`'s strings that are in this set too (raises fsm.BudgetExceeded past
        `max_states`): a set may know a cheaper way than the product with its whole automaton."""
        ...


@dataclass(slots=True, unsafe_hash=True)
class Terminal:
    """Strings matching `pattern` (Python regex syntax, matched whole, no
    lookarounds or back-references), and every regex (or Language) in `also`,
    and none in `excluding`.  `also`/`excluding` express intersection and
    difference (pattern + length bounds, "any key but the declared ones")."""

    pattern: str
    also: tuple["str | Language", ...] = ()
    excluding: tuple["str | Language", ...] = ()
    # (what the front end calls this string, its JSON pointer), for the error when the automaton outgrows the
    # budget; not part of the terminal's identity (equal terminals share one automaton).
    origin: tuple[str, str] | None = field(default=None, compare=False)


@dataclass(slots=True, unsafe_hash=True)
class Ref:
    """A reference to the rule called `name` (may be recursive).  `call`: always a call into the rule, never
    written out in place."""

    name: str
    call: bool = False


@dataclass(slots=True, unsafe_hash=True)
class Seq:
    items: tuple["Expr", ...]


@dataclass(slots=True, unsafe_hash=True)
class Choice:
    items: tuple["Expr", ...]


@dataclass(slots=True, unsafe_hash=True)
class Repeat:
    """`item` repeated between `min` and `max` times (`max=None`: unbounded)."""

    item: "Expr"
    min: int = 0
    max: int | None = None


@dataclass(slots=True, unsafe_hash=True)
class Members:
    """`open`, then `members`, each at most once, and `extra` any number of times, separated by `separator`, then
    `close`: a JSON object.  `ordered`: members in the order given, extras after them; else in any order.  At
    least one member or extra is written (the empty object is the caller's alternative).  `required`: indices
    of members that must appear; `dependents`: (trigger, members needed when the trigger appears); members and
    extras together number between `min` and `max`.  Only a rule's whole body: the rule keeps what it wrote on
    its stack frame."""

    open: "Expr"
    members: tuple["Expr", ...]
    separator: "Expr"
    close: "Expr"
    extra: "Expr | None" = None
    required: frozenset[int] = frozenset()
    dependents: tuple[tuple[int, frozenset[int]], ...] = ()
    min: int = 0
    max: int | None = None
    ordered: bool = False
    max_extras: int | None = None   # where the extras' keys must differ and only so many exist
    # the last members are keys no `properties` declares (required or dependent keys, extra keys the object must
    # hold): in schema order they go among the extras, in any order
    loose: int = 0

    def parts(self) -> list["Expr"]:
        """What the rule calls: open, members, separator, close, extra."""
        return [self.open, *self.members, self.separator, self.close] + ([self.extra] if self.extra is not None else [])


@dataclass(slots=True, unsafe_hash=True)
class Capture:
    """A terminal whose text is recorded while it is written, so that no two extras of the enclosing
    `Members` rule write the same text there: the key of an extra object member, the item of an array with
    uniqueItems.  Texts are compared as written, which tells JSON strings apart exactly where the front end
    writes one encoding per value (as json_strings does)."""

    item: "Expr"


Expr = Union[Lit, Terminal, Ref, Seq, Choice, Repeat, Members, Capture]


@dataclass
class Grammar:
    """Named rules and the start rule's name."""

    rules: dict[str, Expr] = field(default_factory=dict)
    start: str = "start"
