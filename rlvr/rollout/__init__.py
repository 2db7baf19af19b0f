"""Generation engines behind one protocol (`rlvr.rollout.base.GenerationEngine`).

Import engines from their modules (`rlvr.rollout.hf_engine`, later the vLLM one) so that importing this
package stays light.
"""
