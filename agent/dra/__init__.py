"""DRA as the agent reads it: what a node's pods' ResourceClaims ask of which GPU
(:mod:`.claims`), and which GPU each device of the node's ResourceSlices is
(:mod:`.slices`). Pure, on objects as the API server serves them: the views that
fetch them are agent.kube's and agent.sim's. Imports agent.pods and the standard
library only; the loop, the reports and the cap policy import it."""
