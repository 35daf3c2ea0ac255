"""The decoding core: one verify loop, acceptance rules, token trees and drafters.

Works on token ids and tensors only; knows nothing about files, tokenizers' text, or the UI.
"""
