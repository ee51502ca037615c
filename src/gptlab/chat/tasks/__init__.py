"""Built-in chat tasks that need no network: each makes examples, renders them as conversations, verifies answers.

    from gptlab.chat.tasks import get_task
    task = get_task("arithmetic")                    # or Arithmetic(digits=3, ops="+-")
    train = task.examples("train", 10_000)           # SFT data: task.conversation(example) for each
    test = task.examples("test", 200)                # held out: no question is in the train split
    task.verify(test[0], "The answer is 81")         # accuracy by generation (gptlab.eval.chat); reward() for RL

Tasks: arithmetic (multi-digit sums), spelling (spell a word, count a letter),
sorting (words or numbers), word_problems (grade-school maths stories from
templates), compute (questions a short Python program answers), all made
offline; gsm8k (grade-school maths word problems), read from a dataset (the
hub's, or a local copy). Tasks with tools answer by calling them: word_problems
and compute by default, arithmetic with tools=1 (`task.offers_tools`; the
conversation is a gptlab.chat.format.Conversation carrying the tools). Not here:
generating responses with a model (gptlab.eval.chat), running the tools (gptlab.tools).
"""

from gptlab.chat.tasks.arithmetic import Arithmetic
from gptlab.chat.tasks.base import Example, Task
from gptlab.chat.tasks.compute import Compute
from gptlab.chat.tasks.gsm8k import GSM8K
from gptlab.chat.tasks.sorting import Sorting
from gptlab.chat.tasks.spelling import Spelling
from gptlab.chat.tasks.word_problems import WordProblems
from gptlab.runtime import GptlabError

TASKS: dict[str, type[Task]] = {task.name: task for task in (Arithmetic, Spelling, Sorting, GSM8K, WordProblems, Compute)}


def get_task(name: str, **options) -> Task:
    """The task called `name` with its default difficulty, or with `options` (e.g. digits=3 for arithmetic)."""
    if name not in TASKS:
        raise GptlabError(f"unknown chat task {name!r}; the tasks are {', '.join(TASKS)}")
    try:
        return TASKS[name](**options)
    except TypeError as error:
        raise GptlabError(f"bad options for chat task {name!r}: {error}") from None


__all__ = ["GSM8K", "TASKS", "Arithmetic", "Compute", "Example", "Sorting", "Spelling", "Task", "WordProblems", "get_task"]
