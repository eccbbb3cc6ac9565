"""A TRL environment class, written as TRL's GRPOTrainer documents them (docs/env-trl.md):
`GRPOTrainer(environment_factory=CalculatorEnv, ...)` would train it as it is. Its public
methods are the model's tools; `reset` gets the dataset row's columns; `get_reward` scores the
episode from the environment's own state: 1.0 when a tool computed the answer."""


class CalculatorEnv:
    def reset(self, ground_truth, **kwargs) -> None:
        self.answer = float(ground_truth)
        self.results = []

    def get_reward(self) -> float:
        return float(self.answer in self.results)

    def multiply(self, a: float, b: float) -> float:
        """
        Multiply two numbers.

        Args:
            a: The first factor.
            b: The second factor.

        Returns:
            The product a * b.
        """
        self.results.append(a * b)
        return a * b

    def add(self, a: float, b: float) -> float:
        """
        Add two numbers.

        Args:
            a: The first term.
            b: The second term.

        Returns:
            The sum a + b.
        """
        self.results.append(a + b)
        return a + b
