"""Task kinds that asyncrl's roles can carry: control (gymnasium envs, in the flat package for now) and
llm (language models with verifiable rewards, :mod:`asyncrl.tasks.llm`)."""
