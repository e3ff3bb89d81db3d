"""What swift-plt needs of upstream: the verified versions, the guard every patch uses, transformers compatibility."""
