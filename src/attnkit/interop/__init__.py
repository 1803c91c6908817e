"""Interoperability with other ecosystems: reading and writing Hugging Face model directories (`interop.hf`)."""
