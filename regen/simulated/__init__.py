"""The simulated SGLang server (see ``regen.simulated.server``): SGLang's HTTP surface, synthetic text or
the target's tokens, injectable faults; started by ``regen.simulated.launcher``."""
