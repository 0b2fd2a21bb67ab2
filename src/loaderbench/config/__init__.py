"""The config layer: the run's typed schemas (``schema``) and the keys every loader shares
(``loader``), pure dataclasses that import nothing of the project. Hydra composes the YAML under
``conf/`` against them; ``loaderbench.run.validation`` types and checks the composed node."""
