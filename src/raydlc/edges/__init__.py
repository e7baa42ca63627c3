"""One module per outside system (AWS, EKS tokens, Kubernetes, the CLI tools, Ray, the local file system), each taking its client as a parameter and mapping that system's errors once."""
