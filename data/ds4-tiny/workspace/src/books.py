"""Books and the catalogue that holds them."""

MAX_TITLE_LENGTH = 200
DEFAULT_GENRE = "unknown"


class Book:
    def __init__(self, title, author, genre=DEFAULT_GENRE):
        self.title = title[:MAX_TITLE_LENGTH]
        self.author = author
        self.genre = genre
        self.on_loan = False


class Catalogue:
    def __init__(self):
        self.books = []

    def add(self, book):
        self.books.append(book)

    def search(self, word):
        word = word.lower()
        return [b for b in self.books if word in b.title.lower()]
