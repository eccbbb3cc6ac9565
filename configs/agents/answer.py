"""A plain OpenAI-client agent (docs/agents.md): it asks, then asks the model to check its answer
and give the final one. Nothing here knows reasonrl."""


def agent(client, task):
    messages = list(task["messages"])
    first = client.chat.completions.create(model="policy", messages=messages, max_tokens=24)
    messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                 {"role": "user", "content": "Check it. Reply with the final number only."}]
    client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
    return None  # the run's reward function scores the last answer
