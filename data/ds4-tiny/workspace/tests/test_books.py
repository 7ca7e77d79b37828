import unittest

from src.books import Book, Catalogue


class BookTest(unittest.TestCase):
    def test_search(self):
        shelf = Catalogue()
        shelf.add(Book("Persuasion", "Jane Austen"))
        found = shelf.search("persua")
        self.assertEqual(len(found), 1)

    def test_title_is_cut(self):
        book = Book("x" * 500, "anon")
        self.assertEqual(len(book.title), 200)
