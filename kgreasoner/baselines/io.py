"""`io` and `cot`: the LLM answers from its own knowledge, without the KG.

`io` asks for the answer directly; `cot` asks it to reason step by step first. Both ask for the
answer as `Answer: {A | B}`; a reply without that is read leniently (the text after the last
`Answer:`, or its first line) and counted as format-invalid.
"""

from __future__ import annotations

from kgreasoner.baselines.base import Method, MethodResult, braced_answers, first_line_answer
from kgreasoner.llm.clients import MeteredLLM
from kgreasoner.protocol import TOPIC_SEPARATOR, topic_names
from kgreasoner.records.schema import QAExample

IO_PROMPT = (
    'Answer the question from what you know. Write only the answer, in braces after "Answer:"; '
    "separate several answers with |, as in Answer: {{first | second}}.\n"
    "Question: {question}\n"
    "Topic entities: {topics}\n"
    "Answer:"
)

COT_PROMPT = (
    "Answer the question from what you know. First reason step by step, one short sentence per "
    'step; then write the answer in braces after "Answer:", separating several answers with |, '
    "as in Answer: {{first | second}}.\n"
    "Question: {question}\n"
    "Topic entities: {topics}\n"
    "Reasoning:"
)


def build_io_prompt(example: QAExample, chain_of_thought: bool = False) -> str:
    template = COT_PROMPT if chain_of_thought else IO_PROMPT
    return template.format(question=example.question, topics=TOPIC_SEPARATOR.join(topic_names(example.topic_entities)))


def parse_io_reply(reply: str, chain_of_thought: bool = False) -> tuple[list[str], bool]:
    """(answers, format valid). The io prompt already ends with `Answer:`, so a bare `{A}` counts."""
    answers = braced_answers(reply)
    if answers is None and not chain_of_thought and reply.lstrip().startswith("{"):
        answers = braced_answers("Answer:" + reply)
    if answers:
        return answers, True
    return first_line_answer(reply), False


class IOMethod(Method):
    """One LLM call per question; `chain_of_thought=True` is the `cot` method."""

    def __init__(self, chain_of_thought: bool = False, max_tokens: int | None = None) -> None:
        self.chain_of_thought = chain_of_thought
        self.name = "cot" if chain_of_thought else "io"
        self.max_tokens = max_tokens

    def answer(self, example: QAExample, llm: MeteredLLM | None) -> MethodResult:
        client = self.client(llm)
        prompt = build_io_prompt(example, self.chain_of_thought)
        reply = client.complete(prompt, self.max_tokens).text
        answers, valid = parse_io_reply(reply, self.chain_of_thought)
        return MethodResult(answers, valid, trace={"prompt": prompt, "reply": reply})
