"""SGLang's own rules: models, weights, fit, pools, the memory plan, recommendation, flags, the plan file
(``regen.sglang.config.PlanFile``) and realized numbers. Running servers is ``regen.serving``'s job."""
